import pandas as pd
import pyarrow.dataset as ds
import pytest

from rayrollout.data.run_folder import RunFolder
from rayrollout.data.schema import Trajectory
from rayrollout.data.writer import PartWriter, WriterError, make_sink


def rows(n, start=0):
    return [
        Trajectory(
            task_id=f"t{i}", sample_index=i % 2, group_id=f"t{i}", environment="echo", reward=0.5
        ).to_row()
        for i in range(start, start + n)
    ]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_parts_are_written_by_size_and_keys_read_back(tmp_path, fmt):
    sink = make_sink(tmp_path, fmt, "run1")
    sink.start()
    writer = PartWriter(sink, rows_per_part=10, flush_interval_s=3600)
    for table in writer.add(rows(25)):
        writer.write(table)
    assert writer.rows_written == 20 and writer.buffered_rows == 5
    for table in writer.drain():
        writer.write(table)
    assert sorted(p.name for p in tmp_path.glob("part-*")) == [
        f"part-run1-0000{i}.{fmt}" for i in range(3)
    ]
    assert RunFolder(tmp_path, fmt).written_keys() == {(f"t{i}", i % 2) for i in range(25)}


def test_parquet_output_opens_with_pyarrow_and_pandas(tmp_path):
    sink = make_sink(tmp_path, "parquet", "run1")
    sink.start()
    writer = PartWriter(sink, rows_per_part=4, flush_interval_s=3600)
    for table in writer.add(rows(8)):
        writer.write(table)
    (tmp_path / ".part-run0-00000.parquet.tmp").write_bytes(
        b"half a file"
    )  # a killed writer's leftover
    assert ds.dataset(tmp_path, format="parquet").count_rows() == 8
    assert len(pd.read_parquet(tmp_path)) == 8


def test_start_removes_temporary_files_of_killed_runs(tmp_path):
    leftover = tmp_path / ".part-old-00000.parquet.tmp"
    leftover.write_bytes(b"junk")
    make_sink(tmp_path, "parquet", "new").start()
    assert not leftover.exists()


def test_old_rows_are_flushed_after_the_interval(tmp_path):
    sink = make_sink(tmp_path, "parquet", "r")
    sink.start()
    writer = PartWriter(sink, rows_per_part=1000, flush_interval_s=0.0)
    [table] = writer.add(rows(3))
    assert table.num_rows == 3


def test_unwritable_output_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(WriterError, match="cannot create output folder"):
        make_sink(blocker / "out", "parquet", "r").start()
