"""An upstream's load, read from its /metrics text: semgate's names, vLLM's and SGLang's."""

from __future__ import annotations

from gateway.upstream.remote_load import RemoteLoad, parse_load

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 7.0
# HELP vllm:num_requests_running_total A look-alike that is not the gauge.
vllm:num_requests_running_total 99.0
"""

SEMGATE = """\
# TYPE semgate_num_requests_running gauge
semgate_num_requests_running{model_name="m"} 1.0
# TYPE semgate_num_requests_waiting gauge
semgate_num_requests_waiting{model_name="m"} 0.0
"""


def test_vllm_gauges_are_summed_over_engines():
    assert parse_load(VLLM) == RemoteLoad(running=5, waiting=7)


def test_semgate_gauges():
    assert parse_load(SEMGATE) == RemoteLoad(running=1, waiting=0)


SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified"} 2.0
"""


def test_sglang_gauges():
    assert parse_load(SGLANG) == RemoteLoad(running=4, waiting=2)


def test_a_server_exporting_neither_has_unknown_load():
    assert parse_load("# TYPE other gauge\nother 4.0\n") == RemoteLoad(None, None)
