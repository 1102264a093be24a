"""The Kafka bench's arithmetic over rounds (pure; the bench itself runs outside the test suite)."""

from deltadrain.bench import combine_rounds


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
