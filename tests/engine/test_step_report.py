"""The core process's step report over the pipe: its outputs travel as columns of plain
tuples (engine/core_process.py) and come back as the CoreOutputs they were."""

from __future__ import annotations

import pickle

from engine.core_process import RequestFailure, StepReport
from engine.metrics import EngineStats, RequestMetrics
from engine.outputs import CoreOutput
from engine.step_window import StepTime


def test_a_step_report_comes_back_equal_with_its_outputs_typed():
    outputs = [
        CoreOutput("a", [1, 2], False, None, 1.5, None),
        CoreOutput("b", [3], True, "length", 2.5, RequestMetrics(arrival_time=0.5)),
    ]
    report = StepReport(
        outputs, [RequestFailure("c", "bad", invalid=True)], EngineStats(num_running=1),
        StepTime(0.01, 0, 2),
    )  # fmt: skip
    back = pickle.loads(pickle.dumps(report))
    assert back == report
    assert all(type(out) is CoreOutput for out in back.outputs)
    assert back.outputs[1].metrics == RequestMetrics(arrival_time=0.5)


def test_a_report_without_outputs_or_step_comes_back_equal():
    report = StepReport([], [], EngineStats(), None)
    assert pickle.loads(pickle.dumps(report)) == report
