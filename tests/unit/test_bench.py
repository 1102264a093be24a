"""The benches' arithmetic over rounds (pure; the bench itself runs outside the test suite)."""

from deltadrain.dev.bench import combine_rounds, executor_ratios


def side(messages: int, seconds: float) -> dict:
    return {"messages": messages, "seconds": seconds, "rate": round(messages / seconds)}


def test_rounds_combine_into_overall_rates_and_keep_the_spread():
    rounds = [{"structured_streaming": side(2_000_000, 80.0), "drain": side(2_000_000, 100.0)},
              {"drain": side(2_000_000, 60.0), "structured_streaming": side(2_000_000, 40.0)}]
    got = combine_rounds(rounds)
    assert got["structured_streaming"] == {"messages": 4_000_000, "seconds": 120.0, "rate": 33_333}
    assert got["drain"] == {"messages": 4_000_000, "seconds": 160.0, "rate": 25_000}
    # Every message weighs alike: 25 000 / 33 333, not the mean of the per-round ratios (0.7).
    assert got["ratios"] == {"drain_to_structured_streaming": 0.75, "per_round": [0.8, 0.667]}


def test_cpu_report_gives_core_seconds_per_100k_messages_and_the_cores_kept_busy():
    from deltadrain.dev.bench import cpu_report

    before = {"driver_python": 1.0, "driver_jvm": 10.0, "python_workers": 0.0, "source_server": 5.0,
              "machine_busy": 100.0}
    after = {"driver_python": 1.5, "driver_jvm": 40.0, "python_workers": 14.0, "source_server": 13.0,
             "machine_busy": 160.0}
    got = cpu_report(before, after, 1_000_000, 40.0)
    assert got == {"core_seconds_per_100k": {"driver_python": 0.05, "driver_jvm": 3.0, "python_workers": 1.4,
                                             "source_server": 0.8, "machine_busy": 6.0},
                   "cores_busy": 1.5}
    assert cpu_report(before, after, 0, 0.0)["cores_busy"] == 0.0
    with_jit = cpu_report({**before, "driver_jvm_jit": 2.0}, {**after, "driver_jvm_jit": 14.0}, 1_000_000, 40.0)
    assert with_jit["core_seconds_per_100k"]["driver_jvm_jit"] == 1.2
    with_server = cpu_report({**before, "connect_server": 3.0}, {**after, "connect_server": 33.0}, 1_000_000, 40.0)
    assert with_server["core_seconds_per_100k"]["connect_server"] == 3.0


def test_single_process_batch_reads_every_stream_up_to_the_cap():
    from types import SimpleNamespace

    from deltadrain.dev.bench import single_process_batch

    class Client:  # XREADGROUP > over two streams holding 3 and 1 entries
        def __init__(self):
            self.left = {"s:{0}": [b"0-1", b"0-2", b"0-3"], "s:{1}": [b"1-1"]}

        def xreadgroup(self, group, consumer, streams, count):
            (stream, _), = streams.items()
            got, self.left[stream] = self.left[stream][:count], self.left[stream][count:]
            return [[stream, [(i, {b"data": b"{}"}) for i in got]]] if got else []

    pipeline = SimpleNamespace(source=SimpleNamespace(streams=["s:{0}", "s:{1}"]))
    ids, payloads = single_process_batch(Client(), pipeline, "g", "c", 3)
    assert len(payloads) == 3 and sum(map(len, ids.values())) == 3
    ids, payloads = single_process_batch(Client(), pipeline, "g", "c", 10)
    assert ids == {"s:{0}": [b"0-1", b"0-2", b"0-3"], "s:{1}": [b"1-1"]} and len(payloads) == 4


def test_executor_ratios_weigh_every_message_alike_over_the_rounds_given():
    def one(raw: float, local: float, connect: float, single: float) -> dict:
        return {"raw_read": side(400_000, raw), "drain": side(400_000, local),
                "drain_connect": side(400_000, connect), "single_process": side(400_000, single)}

    cold, warm = one(4.0, 20.0, 16.0, 5.0), one(4.0, 20.0, 8.0, 5.0)
    assert executor_ratios([warm]) == {"drain_to_raw_read": 0.2, "drain_connect_to_raw_read": 0.5,
                                       "single_process_to_raw_read": 0.8, "drain_connect_to_single_process": 0.625,
                                       "drain_connect_to_drain": 2.5}
    # Over both rounds: 800 000 messages in 24 s on the server against 8 s of raw reads.
    assert executor_ratios([cold, warm])["drain_connect_to_raw_read"] == 0.333
