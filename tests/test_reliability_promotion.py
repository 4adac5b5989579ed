"""Two promotions racing for the same alias leave it on the better version (real mlflow server and sqlite store)."""

from __future__ import annotations

import threading

import pytest
from mlflow import MlflowClient

from pipelines.tracking import promotion
from pipelines.tracking import Tracking, setup

ALIAS = "champion"
METRIC = "test_mse"  # minimized
FINGERPRINT = "rows-0123"


def _trackings(compose_pipeline, tmp_path, uri: str, n: int) -> list[Tracking]:
    """One Tracking (its own MlflowClient) per promoter."""
    cfg = compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                           "mlflow.experiment_name=promotion-race")
    return [setup(cfg) for _ in range(n)]


def _register(tracking: Tracking, name: str, value: float) -> tuple[str, str, float]:
    """(version, run id, value): a version of ``name`` from a run carrying the metric, as the export stage makes."""
    run = tracking.client.create_run(tracking.experiment_id, run_name=f"{name}-{value}")
    tracking.client.log_metric(run.info.run_id, METRIC, value)
    version = tracking.client.create_model_version(name, f"{run.info.artifact_uri}/model", run.info.run_id,
                                                   tags={promotion.FINGERPRINT_TAG: FINGERPRINT})
    return str(version.version), run.info.run_id, value


def _promote(tracking: Tracking, name: str, version: str, run_id: str, value: float) -> promotion.Decision:
    return promotion.promote(tracking, name, version, run_id, value, METRIC, "minimize", ALIAS,
                             fingerprint=FINGERPRINT)


def _race(trackings: list[Tracking], name: str, racers: list[tuple[str, str, float]]) -> list[promotion.Decision]:
    """``promote`` every racer at once, each from its own thread and client, released by one barrier."""
    barrier = threading.Barrier(len(racers))
    decisions: list = [None] * len(racers)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        version, run_id, value = racers[i]
        try:
            barrier.wait(timeout=30)
            decisions[i] = _promote(trackings[i], name, version, run_id, value)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(racers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return decisions


def _check_story(client, name: str, winner: tuple[str, str, float], losers: list[tuple[str, str, float]],
                 decisions: list[promotion.Decision]) -> None:
    """The alias is on ``winner``; the tags of each version, of its run and the returned decisions agree, and say
    either that a loser was kept for a better holder or that it was promoted and then replaced by the winner."""
    assert str(client.get_model_version_by_alias(name, ALIAS).version) == winner[0]
    tags = {}
    for version, run_id, value in [winner, *losers]:
        tags[version] = {k[len(promotion.TAG):]: v for k, v in client.get_model_version(name, version).tags.items()
                         if k.startswith(promotion.TAG)}
        run_tags = client.get_run(run_id).data.tags
        assert all(run_tags[promotion.TAG + k] == v for k, v in tags[version].items()), (version, run_tags)
        assert tags[version]["metric"] == METRIC and float(tags[version]["candidate_value"]) == pytest.approx(value)
    for decision in decisions:
        version = next(v for v, _, value in [winner, *losers] if value == decision.candidate_value)
        assert {promotion.TAG + k: v for k, v in tags[version].items()} == decision.tags()
    won = tags[winner[0]]
    assert (won["decision"], won["promoted"]) == ("promoted", "True"), won
    if won["holder_version"]:  # it replaced a worse version
        assert float(won["holder_value"]) > winner[2], won
    for version, _, value in losers:
        lost = tags[version]
        if lost["decision"] == "promoted":  # promoted first, then replaced by the winner
            assert won["holder_version"] == version, (won, lost)
        else:
            assert (lost["decision"], lost["promoted"]) == ("kept", "False"), lost
            assert lost["holder_version"] == winner[0], lost
            assert float(lost["holder_value"]) == pytest.approx(winner[2]) and winner[2] < value


@pytest.fixture(params=[pytest.param("server", marks=pytest.mark.xdist_group("mlflow_server")), "sqlite"])
def store_uri(request, clean_mlflow_env):
    return request.getfixturevalue("mlflow_server" if request.param == "server" else "sqlite_uri")


# (value of a holder promoted before the race or None, values of the two racers); test_mse: lower is better
ROUNDS = [(None, (0.5, 0.9)), (None, (0.9, 0.5)), (2.0, (0.5, 0.9)), (2.0, (0.9, 0.5))]


def test_racing_promotions_leave_the_alias_on_the_better_version(store_uri, compose_pipeline, tmp_path):
    trackings = _trackings(compose_pipeline, tmp_path, store_uri, 2)
    client = MlflowClient(store_uri)
    for round_, (holder_value, values) in enumerate(ROUNDS):
        name = f"race-{tmp_path.name}-{round_}"
        client.create_registered_model(name)
        if holder_value is not None:
            holder = _register(trackings[0], name, holder_value)
            assert _promote(trackings[0], name, *holder).promoted
        racers = [_register(trackings[0], name, v) for v in values]
        decisions = _race(trackings, name, racers)
        best = values.index(min(values))
        _check_story(client, name, racers[best], [racers[1 - best]], decisions)
        if holder_value is not None:  # the winner replaced the old holder or the other racer, never the reverse
            assert client.get_model_version(name, racers[best][0]).tags[f"{promotion.TAG}holder_version"] in (
                holder[0], racers[1 - best][0])


def test_racing_promotions_keep_a_better_holder(store_uri, compose_pipeline, tmp_path):
    trackings = _trackings(compose_pipeline, tmp_path, store_uri, 2)
    client = MlflowClient(store_uri)
    name = f"race-better-holder-{tmp_path.name}"
    client.create_registered_model(name)
    holder = _register(trackings[0], name, 0.1)
    assert _promote(trackings[0], name, *holder).promoted
    racers = [_register(trackings[0], name, v) for v in (0.5, 0.9)]
    decisions = _race(trackings, name, racers)
    assert [d.decision for d in decisions] == ["kept", "kept"]
    _check_story(client, name, holder, racers, decisions)
