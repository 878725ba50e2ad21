#!/bin/sh
# The rsh agent of tools/multihost.sh: Open MPI calls it as `netns_agent.sh HOST COMMAND...`
# (as it would call ssh) to start its daemon on HOST, an address 10.231.<k>.<i> of the
# namespace $MULTIHOST_NS_PREFIX<i>; it runs the command there under the host name host<i>.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1
shift
i=${host##*.}
exec ip netns exec "${MULTIHOST_NS_PREFIX:?}$i" unshare --uts -- \
  sh -c 'hostname "host$0"; exec sh -c "$1"' "$i" "$*"
