#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests (not the engine's code).

usage: tfevents_reader.py FILE      prints one JSON object per event:
                                    {"wall_time", "step", "file_version"} or
                                    {"wall_time", "step", "scalars": {tag: simple_value}}

The TFRecord framing is checked with a CRC-32C written here bit by bit (no table, unlike the
engine's), and each record is decoded by Debian's python3-protobuf with the Event, Summary and
Summary.Value messages declared below through the descriptor API (field numbers and types as in
TensorFlow's event.proto and summary.proto). A bad length or CRC exits 1 naming the record.
"""
import json
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    fd = descriptor_pb2.FileDescriptorProto(name="tfevents_test.proto", package="tfevents_test",
                                            syntax="proto3")
    value = fd.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL)
    summary = fd.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tfevents_test.Value")
    event = fd.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tfevents_test.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("tfevents_test.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def records(blob):
    """The data of each TFRecord; raises ValueError naming a bad one."""
    pos, n = 0, 0
    while pos < len(blob):
        if pos + 12 > len(blob):
            raise ValueError("record %d: cut off in its header" % n)
        head = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if head_crc != masked(head):
            raise ValueError("record %d: length CRC mismatch" % n)
        data = blob[pos + 12:pos + 12 + length]
        if len(data) != length or pos + 16 + length > len(blob):
            raise ValueError("record %d: cut off" % n)
        (data_crc,) = struct.unpack("<I", blob[pos + 12 + length:pos + 16 + length])
        if data_crc != masked(data):
            raise ValueError("record %d: data CRC mismatch" % n)
        yield data
        pos += 16 + length
        n += 1


def read(path):
    Event = event_class()
    with open(path, "rb") as f:
        blob = f.read()
    out = []
    for data in records(blob):
        e = Event()
        e.ParseFromString(data)
        row = {"wall_time": e.wall_time, "step": e.step}
        if e.HasField("summary"):
            row["scalars"] = {v.tag: v.simple_value for v in e.summary.value}
        else:
            row["file_version"] = e.file_version
        out.append(row)
    return out


def main():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    try:
        for row in read(sys.argv[1]):
            print(json.dumps(row))
    except ValueError as e:
        print("tfevents_reader: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
