"""The compose check's decisions, without Docker: what it builds, swaps, publishes and accepts as an answer.

`make compose-check` itself needs a Docker engine and minutes, so it is not part of `make test`;
these tests pin down the parts that decide what it does: the image plan read from docker-compose.yml,
the variables it sets, the answer checks, and how a failing or hanging command is reported.
"""

from __future__ import annotations

import sys

import pytest

from deploy import probes
from deploy.compose_check import OPTIONAL, compose_variables, running_services, url_of
from deploy.images import STANDIN_TAG, build_args, build_argv, planned_builds, port_variables, pulled_images
from deploy.steps import StepFailed, Steps
from tests.deploy.stack import COMPOSE_FILE, load_compose, raw_compose


def test_the_image_plan_follows_the_compose_file():
    builds = {b.image: b for b in planned_builds(load_compose())}
    assert set(builds) == {"boundserve-cpu:latest", "boundserve-cpu-compiler:latest",
                           "boundserve-cuda:latest", "boundserve-cuda-compiler:latest"}
    cpu = builds["boundserve-cpu:latest"]
    assert set(cpu.services) == {"demo-model", "worker-cpu", "gateway"} and not cpu.gpu
    assert (cpu.dockerfile, cpu.target, cpu.tag) == ("docker/Dockerfile.cpu", "runtime", "boundserve-cpu:latest")
    cuda = builds["boundserve-cuda:latest"]
    assert set(cuda.services) == {"worker-gpu0", "worker-gpu1"} and cuda.gpu
    assert cuda.tag == f"boundserve-cuda:{STANDIN_TAG}"  # a stand-in never takes the real tag
    assert builds["boundserve-cuda-compiler:latest"].gpu and not builds["boundserve-cpu-compiler:latest"].gpu


def test_one_tag_built_two_ways_is_refused():
    compose = load_compose()
    compose["services"]["gateway"]["build"] = {**compose["services"]["gateway"]["build"], "target": "compiler"}
    with pytest.raises(ValueError, match="tag different builds as boundserve-cpu:latest"):
        planned_builds(compose)


def test_pulled_images_and_the_variables_that_name_them():
    pulled = pulled_images(raw_compose(), load_compose())
    assert [(p.service, p.image, p.variable) for p in pulled] == [
        ("grafana", "grafana/grafana:12.1.1", "GRAFANA_IMAGE"),
        ("prometheus", "prom/prometheus:v3.5.0", "PROMETHEUS_IMAGE")]
    raw = raw_compose()
    raw["services"]["prometheus"]["image"] = "prom/prometheus:v3.5.0"  # written literally: nothing to swap
    assert pulled_images(raw, load_compose())[1].variable is None


def test_published_ports_become_free_ports_and_every_other_variable_its_default(tmp_path):
    raw = raw_compose()
    assert port_variables(raw) == {"GATEWAY_PORT": ("gateway", 8000), "PROMETHEUS_PORT": ("prometheus", 9090),
                                   "GRAFANA_PORT": ("grafana", 3000)}
    env = compose_variables(COMPOSE_FILE.read_text(), raw, tmp_path)
    assert env["MODELS_DIR"] == str(tmp_path) and env["MODEL_DIR"] == str(tmp_path / "demo")
    assert env["BOUNDSERVE_CONFIG"] == "" and env["PROMETHEUS_IMAGE"] == ""  # "" -> the file's default
    assert int(env["GATEWAY_PORT"]) > 0 and env["GATEWAY_PORT"] != env["PROMETHEUS_PORT"]
    assert url_of(raw, env, "gateway", 8000) == f"http://127.0.0.1:{env['GATEWAY_PORT']}"
    with pytest.raises(ValueError, match="publishes no port 1234 of service gateway"):
        url_of(raw, env, "gateway", 1234)


def test_a_fixed_host_port_is_refused_with_the_fix():
    raw = raw_compose()
    raw["services"]["gateway"]["ports"] = ["8000:8000"]
    with pytest.raises(ValueError, match=r"gateway publishes '8000:8000': write `\$\{NAME_PORT:-host\}:container`"):
        port_variables(raw)


def test_up_with_monitoring_runs_the_cpu_stack_prometheus_and_grafana_only():
    assert running_services(load_compose(), ["monitoring"]) == ["gateway", "grafana", "prometheus", "worker-cpu"]


def test_build_arguments_for_each_source():
    assert build_args("base:1", "public", gpu_standin=False) == {"BASE_IMAGE": "base:1"}
    assert build_args("base:1", "wheels", gpu_standin=False) == {
        "BASE_IMAGE": "base:1", "PIP_NO_INDEX": "1", "TORCH_INDEX_URL": ""}
    standin = build_args("base:1", "wheels", gpu_standin=True)
    assert standin["DEVEL_IMAGE"] == "base:1" and standin["TORCH_VARIANT"] == "cpu"


def test_build_argv_passes_target_arguments_and_the_pip_conf_secret(tmp_path):
    conf = tmp_path / "pip.conf"
    argv = build_argv(("docker", "build"), tmp_path / "Dockerfile", "runtime", "img:1", {"A": "1", "B": ""},
                      tmp_path, conf)
    assert argv[:2] == ["docker", "build"] and argv[-1] == str(tmp_path)
    assert ["--target", "runtime"] == argv[argv.index("--target"):argv.index("--target") + 2]
    assert "A=1" in argv and "B=" in argv and f"id=pip.conf,src={conf}" in argv
    assert "--secret" not in build_argv(("docker", "build"), tmp_path / "D", None, "i", {}, tmp_path, None)


GOOD_SCORE = {"scores": [[0.25, 0.75], [0.5, 0.5]]}
GOOD_GENERATE = {"candidates": [{"token_ids": [1, 2, 3], "score": -1.5}, {"token_ids": [4, 5], "score": -2.0}]}


def test_answer_checks_accept_right_answers():
    assert probes.score_problems(200, GOOD_SCORE, 2, 2) == []
    assert probes.generate_problems(200, GOOD_GENERATE, 2, 3) == []


@pytest.mark.parametrize("status, body, why", [
    (503, {"error": {"code": "no_workers"}}, "status 503"),
    (200, {"scores": [[0.25, 0.75]]}, "expected 2 rows"),
    (200, {"scores": [[0.25, 0.5], [0.5, 0.5]]}, "row 0 sums to 0.75"),
    (200, {"scores": [[1.5, -0.5], [0.5, 0.5]]}, "row 0 is not 2 probabilities"),
])
def test_score_check_rejects_wrong_answers(status, body, why):
    assert why in " ".join(probes.score_problems(status, body, 2, 2))


@pytest.mark.parametrize("body, why", [
    ({"candidates": GOOD_GENERATE["candidates"][:1]}, "expected 2 candidates"),
    ({"candidates": [{"token_ids": [1, 2, 3, 4], "score": -1.0}, {"token_ids": [1], "score": -2.0}]}, "candidate 0 has token ids"),
    ({"candidates": [{"token_ids": [1], "score": float("nan")}, {"token_ids": [1], "score": -2.0}]}, "candidate 0 has score"),
    ({"candidates": [{"token_ids": [1], "score": -3.0}, {"token_ids": [1], "score": -2.0}]}, "not best first"),
])
def test_generate_check_rejects_wrong_answers(body, why):
    assert why in " ".join(probes.generate_problems(200, body, 2, 3))


def sample(value: str, **labels: str) -> dict:
    return {"metric": labels, "value": [1.0, value]}


def test_scrape_check_needs_the_target_up_and_both_routes_counted():
    up = [sample("1", job=probes.SCRAPE_JOB)]
    both = [sample("1", route="/v1/score"), sample("2", route="/v1/generate")]
    assert probes.scrape_problem(up, both) is None
    assert "no target" in probes.scrape_problem([], both)
    assert "target down" in probes.scrape_problem([sample("0")], both)
    assert probes.scrape_problem(up, both[:1]) == "not yet scraped: ok requests on /v1/generate"


def test_rules_check_needs_the_group_loaded_and_no_failing_rule():
    ok = [{"name": "boundserve", "rules": [{"name": "r1", "health": "ok"}, {"name": "r2", "health": "unknown"}]}]
    assert probes.rules_problem(ok) is None
    assert probes.rules_problem([]) == "rule group boundserve not loaded"
    bad = [{"name": "boundserve", "rules": [{"name": "r1", "health": "err", "lastError": "bad expr"}]}]
    assert "r1: bad expr" in probes.rules_problem(bad)


def test_wait_for_returns_when_done_and_times_out_with_the_last_reason():
    answers = iter(["starting", "starting", None])
    probes.wait_for("thing", lambda: next(answers), timeout_s=60, interval_s=0)
    with pytest.raises(TimeoutError, match="thing: not within 0 s; last seen: still starting"):
        probes.wait_for("thing", lambda: "still starting", timeout_s=0, interval_s=0)


def test_a_failing_command_fails_its_step_with_its_output(tmp_path):
    steps = Steps(tmp_path, "test")
    with pytest.raises(StepFailed, match=r"(?s)exited with 3.*\nboom\n"):  # the output, not the command line
        with steps.step("fails"):
            steps.run([sys.executable, "-c", "print('bo' + 'om'); raise SystemExit(3)"], timeout_s=60, echo=False)
    assert not steps.done[0].ok and "boom" in steps.done[0].log_path.read_text()
    assert "FAILED" in steps.summary()


def test_a_hanging_command_is_stopped_at_its_timeout(tmp_path):
    steps = Steps(tmp_path, "test")
    with pytest.raises(StepFailed, match="ran past 0 s"):
        steps.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout_s=0.2, echo=False)
    with pytest.raises(StepFailed, match="`no-such-program-here` is not installed"):
        steps.run(["no-such-program-here"], timeout_s=5, echo=False)


def test_only_the_dashboard_may_be_left_out_and_only_from_the_monitoring_profile():
    services = load_compose()["services"]
    assert set(OPTIONAL) == {"grafana"}  # the gateway, the worker and Prometheus are what the check asserts
    assert all(services[name]["profiles"] == ["monitoring"] for name in OPTIONAL)
    assert "grafana" in running_services(load_compose(), ["monitoring"])
