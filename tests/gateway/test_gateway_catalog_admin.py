"""POST /admin/constraints through the gateway to a real worker on a constrained beam node: a new
catalogue version without a rebuild or restart, refusals named, and the route closed on a gateway
without a bearer token."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from shared.config import BeamConfig, ScoreConfig
from tests.builds import CATALOG_BOUNDS, VALID, semantic_ids, without_bounds, write_sequences
from tests.gateway.test_gateway_real_worker import real_gateway

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "admin-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FR = semantic_ids(53, 100, 3)
"""A second market's catalogue: every candidate decoded in it is one of its sequences (all 3 tokens long)."""
pytestmark = pytest.mark.slow  # a constrained beam node compiled once per machine (tests/builds.py)


def worker_config(folder: Path, start: Path) -> Path:
    """configs/test.toml without [bounds] (the worker serves what was compiled) and with the constrained
    [beam] section: the catalogue it loads at start and the compiled table sizes."""
    text = without_bounds((ROOT / "configs/test.toml").read_text())
    beam = "\n".join(["enabled = true", f'constraints = "{start}"'] + [f"{k} = {v}" for k, v in CATALOG_BOUNDS.items()])
    text = re.sub(r"(?ms)^\[beam\]\n.*?(?=^\[|\Z)", f"[beam]\n{beam}\n\n", text)
    path = folder / "worker.toml"
    path.write_text(text)
    return path


@contextlib.asynccontextmanager
async def admin_stack(artifacts: Path, folder: Path, token: str | None):
    start = write_sequences(folder / "valid.txt", VALID)
    beam = BeamConfig(enabled=True, constraints=str(start), **CATALOG_BOUNDS)
    async with real_gateway(artifacts, folder, worker_config(folder, start), token, score=ScoreConfig(enabled=False),
                            beam=beam, bounds=None) as client:
        yield client


async def test_a_new_catalogue_version_is_served_without_a_rebuild(constrained_beam_artifacts, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in constrained_beam_artifacts.rglob("*") if p.is_file()}
    market = write_sequences(tmp_path / "fr.txt", FR)
    async with admin_stack(constrained_beam_artifacts, tmp_path, TOKEN) as client:
        response = await client.post("/admin/constraints", json={"load": {"fr": str(market)}}, headers=AUTH)
        answer = await response.json()
        assert response.status == 200, answer
        (worker,) = answer["workers"]
        assert worker["version"] >= 2 and worker["error"] == ""  # version 1 is the catalogue loaded at start
        assert worker["items"]["fr"] == 100 and "default" in worker["items"]

        # a request names the market it decodes in; the answer says which version served it
        body = {"prompt": "red running shoe", "beam_width": 4, "max_new_tokens": 3, "num_return_sequences": 2}
        served = await client.post("/v1/generate", json={**body, "catalog": "fr"}, headers=AUTH)
        answer = await served.json()
        assert served.status == 200 and answer["catalog_version"] == worker["version"], answer
        allowed = {tuple(ids) for ids in FR}
        assert all(tuple(c["token_ids"]) in allowed for c in answer["candidates"]), answer["candidates"]
        default = await (await client.post("/v1/generate", json=body, headers=AUTH)).json()
        valid = {tuple(ids) for ids in VALID}  # 3- and 2-token sequences; a 2-token one ends with the EOS after it
        assert all(tuple(c["token_ids"]) in valid or tuple(c["token_ids"][:2]) in valid
                   for c in default["candidates"]), default
        unknown = await client.post("/v1/generate", json={**body, "catalog": "jp"}, headers=AUTH)
        assert unknown.status >= 400 and "jp" in (await unknown.json())["error"]["message"]

        response = await client.post("/admin/constraints", json={"unload": ["fr"]}, headers=AUTH)
        answer = await response.json()
        assert response.status == 200, answer
        assert answer["workers"][0]["version"] > worker["version"] and "fr" not in answer["workers"][0]["items"]
    assert {p: p.stat().st_mtime_ns for p in constrained_beam_artifacts.rglob("*") if p.is_file()} == before


async def test_refusals_are_named_and_the_current_version_keeps_serving(constrained_beam_artifacts, tmp_path):
    too_big = write_sequences(tmp_path / "big.txt", semantic_ids(54, 5000, 3))
    async with admin_stack(constrained_beam_artifacts, tmp_path, TOKEN) as client:
        response = await client.post("/admin/constraints", json={"load": {"big": str(too_big)}}, headers=AUTH)
        answer = await response.json()
        assert response.status == 502 and answer["error"]["code"] == "catalog_update_failed", answer
        assert "max_catalog_nodes" in answer["error"]["message"] and "keeps serving" in answer["error"]["message"]

        missing = await client.post("/admin/constraints", json={"load": {"x": str(tmp_path / "none.npz")}},
                                    headers=AUTH)
        assert missing.status == 502 and "none.npz" in (await missing.json())["error"]["message"]

        for body, words in (({}, "name catalogues"), ({"load": {"a": "p"}, "unload": ["a"]}, "both loaded and unloaded"),
                            ({"load": {"bad name!": "p"}}, "load"), ({"reload": True}, "reload")):
            response = await client.post("/admin/constraints", json=body, headers=AUTH)
            answer = await response.json()
            assert response.status == 400 and words in answer["error"]["message"], (body, answer)

        unauthorized = await client.post("/admin/constraints", json={"unload": ["x"]})
        assert unauthorized.status == 401


async def test_a_gateway_without_a_token_refuses_admin_routes(constrained_beam_artifacts, tmp_path):
    async with admin_stack(constrained_beam_artifacts, tmp_path, None) as client:
        response = await client.post("/admin/constraints", json={"unload": ["x"]})
        answer = await response.json()
        assert response.status == 403 and "auth_token_env" in answer["error"]["message"], answer
