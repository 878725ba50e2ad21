#!/usr/bin/python3
"""A grid's runs in one compressed file: the compact form the experiments commit.

usage: runpack.py sync PACK DIR RUN... [--keep KEY,KEY,...] [--every N]
                                                              # PACK holds exactly RUN...: each from
                                                              # DIR/RUN/ (RUN=FOLDER: from FOLDER)
                                                              # where that folder is, else from
                                                              # PACK as it was
       runpack.py unpack PACK DIR [RUN...]                     # DIR/RUN/ from PACK (all by default)
       runpack.py list PACK

A pack (runs.jsonl.xz) is xz-compressed JSON Lines, one line per run, in run order:
  {"run": NAME, "result": {...}, "metrics": [{...}, ...], "log": "...", "files": {NAME: "..."}}
"result" is the run's result.json, "metrics" its metrics.jsonl rows, "log" its log.txt (the
banner, the effective config, the console lines), "files" any other text file named on packing.
Each part is there when the run folder had it. The metrics rows are thinned to the keys a
driver names (--keep; default every key): the step and what its tables read, the rest (phase
times, communication bytes, memory, ...) dropped; a row with a val_loss keeps it whatever the
list. With --every N only every N-th step's training row is kept besides the first and the last
and every row with a val_loss (the drivers whose tables read no training row thin the curve so:
the runs' whole curves stay in the history of the commits that first held them). Read it with Python's lzma module (lzma.open(path, "rt")) or `xzcat`.
"""
import json
import lzma
import os
import sys

FILE = "runs.jsonl.xz"


def thin(rows, keep, every=1):
    """The metrics rows with only the keys in `keep` (and step, val_loss; keep None: every key),
    and of the rows without a val_loss only every `every`-th step's, the first and the last."""
    rows = [r for i, r in enumerate(rows)
            if every <= 1 or "val_loss" in r or r.get("step", 0) % every == 0 or i in (0, len(rows) - 1)]
    if keep is None:
        return rows
    keep = set(keep) | {"step", "val_loss"}
    return [{k: v for k, v in r.items() if k in keep} for r in rows]


def pack_run(run_dir, name, keep=None, files=(), every=1):
    """One run folder as a pack record (its result.json, metrics.jsonl rows thinned as `thin`
    does, log.txt and the text `files`); a part the folder lacks is left out."""
    rec = {"run": name}
    path = os.path.join(run_dir, "result.json")
    if os.path.isfile(path):
        with open(path) as f:
            rec["result"] = json.load(f)
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            rec["metrics"] = thin([json.loads(line) for line in f if line.strip()], keep, every)
    path = os.path.join(run_dir, "log.txt")
    if os.path.isfile(path):
        with open(path, errors="replace") as f:
            rec["log"] = f.read()
    for name_ in files:
        path = os.path.join(run_dir, name_)
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                rec.setdefault("files", {})[name_] = f.read()
    return rec


def read(pack):
    """{run name: record} of a pack, in its order; {} when there is no pack."""
    if not os.path.isfile(pack):
        return {}
    out = {}
    with lzma.open(pack, "rt") as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
                out[rec["run"]] = rec
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError("%s:%d: not a pack record (%s)" % (pack, n, e))
    return out


def write(pack, records):
    """Writes the records (a list, in run order) as the pack, whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(pack)), exist_ok=True)
    tmp = pack + ".tmp"
    with lzma.open(tmp, "wt", preset=9 | lzma.PRESET_EXTREME) as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    os.replace(tmp, pack)


def add(pack, records):
    """The pack with these records added (a run already there replaced in place)."""
    held = read(pack)
    for rec in records:
        held[rec["run"]] = rec
    write(pack, list(held.values()))


def unpack_run(rec, run_dir):
    """A pack record as a run folder (result.json, metrics.jsonl, log.txt, its files)."""
    os.makedirs(run_dir, exist_ok=True)
    if "metrics" in rec:
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rec["metrics"])
    if "log" in rec:
        with open(os.path.join(run_dir, "log.txt"), "w") as f:
            f.write(rec["log"])
    for name, text in rec.get("files", {}).items():
        with open(os.path.join(run_dir, name), "w") as f:
            f.write(text)
    if "result" in rec:  # last: a folder with a result.json is a finished run
        with open(os.path.join(run_dir, "result.json"), "w") as f:
            json.dump(rec["result"], f, indent=1)


def main(argv):
    if not argv or argv[0] not in ("sync", "unpack", "list") or len(argv) < (2 if argv[0] == "list" else 3):
        sys.exit(__doc__.split("\n\n")[1])
    cmd, pack = argv[0], argv[1]
    if cmd == "list":
        for name in read(pack):
            print(name)
        return 0
    keep, every = None, 1
    if "--keep" in argv:
        i = argv.index("--keep")
        keep = [k for k in argv[i + 1].split(",") if k]
        argv = argv[:i] + argv[i + 2:]
    if "--every" in argv:
        i = argv.index("--every")
        every = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    folder, runs = argv[2], argv[3:]
    held = read(pack)
    if cmd == "unpack":
        for name in runs or held:
            if name not in held:
                sys.exit("runpack: %s holds no run %s" % (pack, name))
            unpack_run(held[name], os.path.join(folder, name))
        return 0
    records = []
    for item in runs:
        name, _, d = item.partition("=")
        d = d or os.path.join(folder, name)
        if os.path.isdir(d):
            records.append(pack_run(d, name, keep, every=every))
        elif name in held:
            records.append(held[name])
        else:
            print("runpack: no %s and no run %s in %s" % (d, name, pack), file=sys.stderr)
    write(pack, records)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
