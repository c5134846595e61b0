"""An episode spec crosses processes with its task as bytes: the engine queues and forwards it
without reading the task, the worker reads the same task, and a task read and changed in a
process travels as changed."""

import pickle

from rayrollout.data.tasks import parse_task_row
from rayrollout.engine.episode_spec import EpisodeSpec


def task():
    return parse_task_row({"task_id": "t1", "prompt": "hi", "environment": "echo"})


def test_a_forwarded_spec_keeps_its_task_unread_until_the_worker_reads_it():
    sent = EpisodeSpec(task(), 3)
    at_engine = pickle.loads(pickle.dumps(sent))
    assert at_engine.environment == "echo" and at_engine._task is None  # never read there
    at_engine.queued_at = 12.5
    at_worker = pickle.loads(pickle.dumps([(7, at_engine, True)], protocol=5))[0][1]
    assert at_engine._task is None
    assert at_worker.task == sent.task and at_worker.key == ("t1", 3)
    assert at_worker.queued_at == 12.5 and at_worker == EpisodeSpec(task(), 3, 12.5)


def test_a_task_read_and_changed_travels_as_changed():
    at_engine = pickle.loads(pickle.dumps(EpisodeSpec(task())))
    at_engine.task.task_id = "changed"
    assert pickle.loads(pickle.dumps(at_engine)).key == ("changed", 0)
    assert at_engine != EpisodeSpec(task())
