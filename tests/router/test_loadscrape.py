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


def test_parse_load_reads_waiting_and_kv_usage() -> None:
    assert parse_load(ENGINE_PAGE) == (7, 0.42)
    assert parse_load("vllm:num_requests_waiting 2\nvllm:num_requests_waiting{model_name=\"b\"} 3\n") == (5, 0.0)
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
        await scraper.scrape_all(balancer.replicas())
        assert (live.waiting, live.kv_usage, live.scraped_at) == (7, 0.42, 100.0)
        assert dead.scraped_at is None  # refused: in-flight only
        assert balancer.queue_load(live, 100.0) == 7

        up.metrics_status = 500
        assert not await scraper.scrape(live)
        assert live.scraped_at is None and balancer.queue_load(live, 100.0) == 0
        up.metrics_status, up.metrics = 200, "# not an engine\nup 1\n"
        assert not await scraper.scrape(live)
        assert live.scraped_at is None


def test_a_stale_scrape_falls_back_to_in_flight_only() -> None:
    now = [0.0]
    balancer = Balancer(settings=LoadBalancingSpec(strategy="LeastLoaded"), clock=lambda: now[0])
    balancer.update({"r1": ["http://a", "http://b"]})
    a, b = balancer.pool("r1")
    a.waiting, a.scraped_at = 10, 0.0  # a's engine is queueing requests from other routers
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
    home.waiting, home.scraped_at = 5, 1.0  # its engine is swamped by another router's traffic
    other = balancer.pick("r1", key=key)
    assert other is not None and other is not home
