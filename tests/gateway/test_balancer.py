"""The balancer's policies and the prefix table on their own (gateway/upstream/balancer.py,
gateway/upstream/prefix_table.py): the choices among servers whose loads the tests set;
tests/gateway/test_balancer_engines.py runs them against real engine servers."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.upstream.balancer import Backend, Balancer, BalancerConfig, BalancerKey, prompt_text
from gateway.upstream.prefix_table import BLOCK_BYTES, MAX_BLOCKS, PrefixTable, prompt_blocks

CONTEXT = "Read the passages below, then answer briefly. " * 40  # some 1,800 bytes


def backends(*names: str, **weights: float) -> list[Backend]:
    return [Backend(name, weights.get(name, 1.0)) for name in names]


def ask(balancer: Balancer, servers: list[Backend], prompt: str, session: str | None = None):
    key = balancer.key("m", prompt_text([{"role": "user", "content": prompt}]), None, session)
    return balancer.choose(servers, key)


def test_prompt_blocks_are_chained_whole_blocks_of_the_start():
    a = prompt_blocks("m", CONTEXT + "Question one?")
    b = prompt_blocks("m", CONTEXT + "Another question, longer than the first one?")
    shared = len(CONTEXT) // BLOCK_BYTES
    assert a[:shared] == b[:shared]
    assert len(a) == len(CONTEXT + "Question one?") // BLOCK_BYTES  # no partial block
    assert prompt_blocks("m", "x" * (BLOCK_BYTES - 1)) == ()
    assert len(prompt_blocks("m", "x" * BLOCK_BYTES * (MAX_BLOCKS + 5))) == MAX_BLOCKS
    # Another root (model, prefix-cache salt) shares nothing, not even equal blocks.
    assert not set(prompt_blocks("m\0salt", CONTEXT)) & set(prompt_blocks("m", CONTEXT))
    # Chained: an equal block after a different start is another block.
    assert prompt_blocks("m", "y" * BLOCK_BYTES + CONTEXT)[-1] != a[shared - 1]


def test_the_table_matches_leading_blocks_and_evicts_chains_from_their_ends():
    table = PrefixTable(capacity=4, ttl=60)
    first, second = (1, 2, 3), (7, 8)
    table.record("a", first)
    table.record("b", first[:2])
    assert table.matches((1, 2, 3, 4), {"a", "b"}) == {"a": 3, "b": 2}
    assert table.matches((1, 2, 3), {"b"}) == {"b": 2}  # only the servers asked about
    assert table.matches((9, 2, 3), {"a", "b"}) == {}
    table.record("a", second)  # 5 blocks > 4: the oldest, the first chain's end, goes
    assert table.size("a") == 4
    assert table.matches(first, {"a"}) == {"a": 2}
    table.forget("a")
    assert table.size("a") == 0
    assert table.matches(first, {"a", "b"}) == {"b": 2}


def test_blocks_unsent_for_the_ttl_count_as_gone():
    now = [0.0]
    table = PrefixTable(capacity=100, ttl=10, clock=lambda: now[0])
    table.record("a", (1, 2))
    now[0] = 9.0
    assert table.matches((1, 2), {"a"}) == {"a": 2}
    now[0] = 10.0
    assert table.matches((1, 2), {"a"}) == {}


def test_prefix_sends_a_prompt_start_back_to_its_server_and_new_ones_to_the_emptiest():
    balancer = Balancer(BalancerConfig(policy="prefix"))
    servers = backends("a", "b")
    first = ask(balancer, servers, CONTEXT + "Who?")
    other = ask(balancer, servers, "Another context entirely. " * 40 + "Who?")
    assert other is not first  # its table was the smaller
    for question in ("What?", "Where?", "Why?"):
        assert ask(balancer, servers, CONTEXT + question) is first
    assert first.chosen == Counter(fallback=1, prefix=3)
    assert other.chosen == Counter(fallback=1)


def test_past_the_balance_threshold_the_least_loaded_server_answers():
    balancer = Balancer(BalancerConfig(policy="prefix", balance_threshold=2))
    a, b = servers = backends("a", "b")
    assert ask(balancer, servers, CONTEXT + "Who?") is a
    a.in_flight = 2  # by 2: not more than the threshold
    assert ask(balancer, servers, CONTEXT + "What?") is a
    a.in_flight = 3
    assert ask(balancer, servers, CONTEXT + "Why?") is b
    assert b.chosen == Counter(load=1)
    # b holds the context now too: the less loaded of the two gets it.
    a.in_flight, b.in_flight = 1, 0
    assert ask(balancer, servers, CONTEXT + "When?") is b
    assert b.chosen == Counter(load=1, prefix=1)


def test_load_is_per_unit_of_weight_and_counts_other_clients_once():
    balancer = Balancer(BalancerConfig(policy="least_load"))
    a, b = servers = backends("a", "b", a=2.0)
    a.in_flight, b.in_flight = 3, 2  # 1.5 and 2 per unit of weight
    assert ask(balancer, servers, "hi") is a
    # The engine's own counts include our requests in flight: only the rest are others'.
    b.observe(running=2, waiting=3)
    assert b.others == 3 and b.load == 5
    b.observe(running=None, waiting=None)  # no /metrics: ours alone
    assert b.load == 2
    assert a.chosen == Counter(load=1)


def test_round_robin_takes_turns_in_proportion_to_the_weights():
    balancer = Balancer(BalancerConfig(policy="round_robin"))
    servers = backends("a", "b", "c", a=2.0)
    picks = Counter(ask(balancer, servers, CONTEXT).name for _ in range(40))
    assert picks == {"a": 20, "b": 10, "c": 10}
    assert all(set(b.chosen) == {"fallback"} for b in servers)


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "prefix"])
def test_a_session_stays_on_its_server_while_it_is_healthy(policy: str):
    balancer = Balancer(BalancerConfig(policy=policy))
    servers = backends("a", "b")
    first = ask(balancer, servers, "Start of a conversation.", session="s1")
    first.in_flight = 5  # busy: a session stays all the same
    for turn in range(4):
        assert ask(balancer, servers, f"Turn {turn}, another prompt.", session="s1") is first
    assert first.chosen["session"] == 4
    balancer.forget(first.name)  # it went down: the session moves, and stays moved
    rest = [s for s in servers if s is not first]
    moved = ask(balancer, rest, "Turn 5.", session="s1")
    assert moved is not first
    assert ask(balancer, servers, "Turn 6.", session="s1") is moved


def test_without_session_affinity_a_session_is_routed_as_any_request():
    balancer = Balancer(BalancerConfig(policy="round_robin", session_affinity=False))
    servers = backends("a", "b")
    picks = {ask(balancer, servers, "hi", session="s1").name for _ in range(2)}
    assert picks == {"a", "b"}


def test_a_retry_counts_as_fallback_and_a_dead_servers_prefixes_are_forgotten():
    balancer = Balancer(BalancerConfig(policy="prefix"))
    a, b = backends("a", "b")
    key = balancer.key("m", CONTEXT, None, None)
    assert balancer.choose([a, b], key) is a
    balancer.forget("a")  # a failed: the retry goes to b
    assert balancer.choose([b], key, retry=True) is b
    assert b.chosen == Counter(fallback=1)
    assert balancer.choose([a, b], key) is b  # its prompt start lives on b now
    assert b.chosen == Counter(fallback=1, prefix=1)


def test_balancer_settings_are_checked():
    with pytest.raises(ValueError, match="policy must be one of round_robin, least_load, prefix"):
        BalancerConfig(policy="random")
    with pytest.raises(ValueError, match="balance_threshold must be >= 0"):
        BalancerConfig(balance_threshold=-1)
    # Only prefix hashes prompts.
    assert (
        Balancer(BalancerConfig(policy="least_load")).key("m", CONTEXT, None, None) == BalancerKey()
    )
