"""Message logs: every message an actor sends or receives, recorded to disk for inspection and replay.

`Recorder` appends `[header, body, *blobs]` frames to segment files; `LogReader` / `read_log` read them
back as `Record`s; `query` filters records, turns them into JSON and exports screenshots. The on-disk
format is documented in `guirl.msglog.format`.
"""

from guirl.msglog.format import MsgLogError
from guirl.msglog.query import RecordFilter, export_screenshots, record_to_json
from guirl.msglog.reader import BlobRef, LogReader, Record, encode_body, read_log
from guirl.msglog.recorder import Recorder

__all__ = [
    "BlobRef",
    "LogReader",
    "MsgLogError",
    "Record",
    "RecordFilter",
    "Recorder",
    "encode_body",
    "export_screenshots",
    "read_log",
    "record_to_json",
]
