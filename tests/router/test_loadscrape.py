"""Scraping each replica's load from its /metrics, and what the balancer does with it (or without it)."""

from __future__ import annotations

import aiohttp

from folio.operator.router.balancer import STALE_AFTER, Balancer
from folio.operator.router.loadscrape import LoadScraper, parse_load
from folio.operator.spec import LoadBalancingSpec
from tests.router.upstreams import FakeUpstream, dead_url, serving

ENGINE_PAGE = """\
# HELP vllm:num_requests_waiting Requests waiting to be scheduled.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m, with a space}"} 0.42
vllm:num_requests_waiting_by_reason{model_name="m"} 99.0
"""


def test_parse_load_reads_requests_held_and_kv_usage() -> None:
    assert parse_load(ENGINE_PAGE) == (7 + 3, 0.42)  # waiting and running: everything the engine holds
    assert parse_load("vllm:num_requests_waiting 2\nvllm:num_requests_waiting{model_name=\"b\"} 3\n") == (5, 0.0)
    assert parse_load("vllm:num_requests_running 4\n") == (4, 0.0)
    assert parse_load("vllm:kv_cache_usage_perc 1.7\n") == (0, 1.0)  # clamped to a fraction
    assert parse_load("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc oops\n") is None
    assert parse_load("process_cpu_seconds_total 1\n") is None
    assert parse_load("") is None


async def test_scraper_fills_in_the_load_and_forgets_it_when_a_scrape_fails() -> None:
    up = FakeUpstream("r1", metrics=ENGINE_PAGE)
    balancer = Balancer()
    async with serving(up), aiohttp.ClientSession() as session:
        balancer.update({"r1": [up.url, dead_url()]})
        live, dead = balancer.pool("r1")
        scraper = LoadScraper(session, balancer.replicas, clock=lambda: 100.0)
        live.in_flight = 4  # ours: among the engine's 10
        await scraper.poll_all(balancer.replicas())
        assert (live.engine_requests, live.ours_at_scrape, live.kv_usage, live.scraped_at) == (10, 4, 0.42, 100.0)
        assert dead.scraped_at is None  # refused: in-flight only
        assert balancer.queue_load(live, 100.0) == 4 + 6  # ours now, and the 6 that were not ours
        live.in_flight = 1  # three of ours finished since: the others' 6 stay until the next scrape
        assert balancer.queue_load(live, 100.0) == 1 + 6
        live.in_flight = 4

        up.metrics_status = 500
        assert not await scraper.poll(live)
        assert live.scraped_at is None and balancer.queue_load(live, 100.0) == 4
        up.metrics_status, up.metrics = 200, "# not an engine\nup 1\n"
        assert not await scraper.poll(live)
        assert live.scraped_at is None


def test_a_stale_scrape_falls_back_to_in_flight_only() -> None:
    now = [0.0]
    balancer = Balancer(settings=LoadBalancingSpec(strategy="LeastLoaded"), clock=lambda: now[0])
    balancer.update({"r1": ["http://a", "http://b"]})
    a, b = balancer.pool("r1")
    a.engine_requests, a.scraped_at = 10, 0.0  # a's engine is queueing requests from other routers
    b.in_flight = 2
    assert balancer.pick("r1") is b  # 2 < 0 + 10
    now[0] = STALE_AFTER + 0.1
    assert balancer.pick("r1") is a  # the figure is too old to trust: 0 < 2


def test_least_loaded_breaks_ties_by_kv_cache_usage() -> None:
    balancer = Balancer(settings=LoadBalancingSpec(strategy="LeastLoaded"), clock=lambda: 1.0)
    balancer.update({"r1": ["http://a", "http://b", "http://c"]})
    a, b, c = balancer.pool("r1")
    for replica, usage in ((a, 0.9), (b, 0.2), (c, 0.5)):
        replica.kv_usage, replica.scraped_at = usage, 1.0
    assert {balancer.pick("r1") for _ in range(6)} == {b}


def test_prefix_hash_bound_counts_the_engines_queue() -> None:
    balancer = Balancer(clock=lambda: 1.0)
    balancer.update({"r1": ["http://a", "http://b"]})
    key = "prefix\0shared system prompt"
    home = balancer.pick("r1", key=key)
    assert home is not None and balancer.pick("r1", key=key) is home
    home.engine_requests, home.scraped_at = 5, 1.0  # its engine is swamped by another router's traffic
    other = balancer.pick("r1", key=key)
    assert other is not None and other is not home


def test_our_own_requests_in_the_engines_queue_count_once() -> None:
    # One router alone in front of two engines: everything the engines hold is ours. Counting the engine's
    # figure on top of our in-flight would double the home's load and spill its key for no reason.
    balancer = Balancer(clock=lambda: 1.0)
    balancer.update({"r1": ["http://a", "http://b"]})
    key = "prefix\0shared system prompt"
    home = balancer.pick("r1", key=key)
    assert home is not None
    other = next(r for r in balancer.pool("r1") if r is not home)
    home.in_flight, other.in_flight = 3, 2  # the home's engine runs one of its three and queues two
    for replica in (home, other):  # a scrape while all of them were queued or running there
        replica.engine_requests, replica.ours_at_scrape, replica.scraped_at = replica.in_flight, replica.in_flight, 1.0
    assert [balancer.queue_load(r, 1.0) for r in (home, other)] == [3, 2]
    # the bound ceil(1.25 x (5 + 1) / 2) = 4 admits the home's fourth; with its two queued counted again
    # (3 + 2 against 2: ceil(1.25 x 8 / 2) = 5 < 5 + 1) the key would spill
    assert balancer.pick("r1", key=key) is home
