"""Single-step GUI grounding data (GUI-R1 mode): rows, their loaders and writers, synthetic screens."""

from guirl.data.rows import (
    GroundingRow,
    RowError,
    gui_r1_answer,
    load_rows,
    write_rows_jsonl,
    write_rows_parquet,
)

__all__ = [
    "GroundingRow",
    "RowError",
    "gui_r1_answer",
    "load_rows",
    "write_rows_jsonl",
    "write_rows_parquet",
]
