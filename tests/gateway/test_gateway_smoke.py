"""Smoke: a score request through real HTTP and ZeroMQ to the stand-in worker."""

async def test_score_probs(stack):
    status, body, headers = await stack.post("/v1/score", {"samples": ["good shoe", "bad phone"], "labels": ["yes", "no"]})
    assert status == 200, body
    print(body)
