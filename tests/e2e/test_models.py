"""Fine-tuned models from the registry, through the real fleet: every task in one job."""

from __future__ import annotations

import csv
import io
import json

import pytest

from inference.precision import choose, runtime_label
from tests.e2e.procs import (
    BIN,
    all_or_none,
    http,
    start_web,
    start_worker,
    wait_for,
    wait_ready,
)
from tests.tiny_models import make_seqcls_model, make_token_model

pytestmark = pytest.mark.e2e

TOPICS = ["sports", "food", "tech"]
TEXTS = [
    "john smith visited acme corp in london, mail john@acme.example",
    "the food was great and the staff very fast",
    "refund $12.50 by 2024-06-11 or call +44 20 7946 0958",
]


@pytest.fixture(scope="module")
def registry_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    models = {
        "topic": {
            "kind": "sequence-classification",
            "path": str(make_seqcls_model(root / "topic", TOPICS, bias=[0, 5, 0])),
        },
        "sentiment": {
            "kind": "sequence-classification",
            "path": str(make_seqcls_model(root / "sentiment", ["negative", "positive"], [0, 6])),
            "max_length": 64,
        },
        "ner": {
            "kind": "token-classification",
            # Biased to "O": the model finds nothing, so every pattern entity shows.
            "path": str(
                make_token_model(
                    root / "ner", ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"], bias=[8, 0, 0, 0, 0]
                )
            ),
        },
    }
    return {
        "LANEWAY_MODELS": json.dumps(models),
        "LANEWAY_CLASSIFY_MODEL": "topic",
        "LANEWAY_SCORE_MODEL": "sentiment",
        "LANEWAY_EXTRACT_MODEL": "ner",
    }


@pytest.fixture(scope="module")
def fleet(migrated, registry_env, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("models-logs")
    argv = [str(BIN / "laneway"), "worker", "cpu"]
    with all_or_none():
        worker = start_worker("cpu", argv, logdir, env=registry_env, wait=False)
        web, url = start_web(logdir, registry_env)  # while the worker loads its models
        wait_ready({worker: "cpu"})
    yield url, worker
    worker.stop()
    web.stop()


def test_every_task_with_fine_tuned_models(fleet, account_factory):
    url, worker = fleet
    _, key = account_factory("standard")
    headers = {"Authorization": f"Bearer {key}"}
    items = [{"id": f"m{i}", "text": t} for i, t in enumerate(TEXTS)]

    # A fine-tuned classifier's labels are fixed: naming others is a clear 400.
    bad = http.post(
        f"{url}/v1/jobs",
        json={"tasks": ["classify"], "items": items, "labels": ["x", "y"]},
        headers=headers,
    )
    assert bad.status_code == 400 and "fixed labels (sports, food, tech)" in bad.json()["message"]

    response = http.post(
        f"{url}/v1/jobs",
        json={"tasks": ["classify", "score", "extract", "embed"], "items": items},
        headers=headers,
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    def final():
        job = http.get(f"{url}/v1/jobs/{job_id}", headers=headers).json()
        return job if job["status"] not in ("queued", "running") else None

    job = wait_for(final, 180, "the fine-tuned job", [worker])
    assert job["status"] == "succeeded", job
    assert job["tasks"] == ["classify", "score", "extract", "embed"]
    assert job["labels"] == TOPICS
    assert job["cost"]["total"] > 0 and set(job["cost"]["by_stage"]) == {"pre", "model", "post"}
    # Every model was checked at the worker's start and runs in this CPU's precision (bf16
    # where it computes bf16 natively); the job says so, per runtime.
    expected = choose("auto", "cpu").precision
    assert job["precision"] == expected, job["runtimes"]
    assert [(r["runtime"], r["device"]) for r in job["runtimes"]] == [
        (runtime_label(expected, "cpu"), "cpu")
    ]

    lines = http.get(f"{url}/v1/jobs/{job_id}/results", headers=headers).text.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == ["m0", "m1", "m2"]
    for text, record in zip(TEXTS, records, strict=True):
        assert set(record) == {
            "id",
            "label",
            "score",
            "scores",
            "rating",
            "entities",
            "embedding",
            "tokens",
        }
        assert record["label"] == "food" and set(record["scores"]) == set(TOPICS)
        assert record["rating"] > 0.9
        assert len(record["embedding"]) == 384
        for entity in record["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["text"]
    found = {(e["type"], e["text"]) for r in records for e in r["entities"]}
    assert found == {
        ("email", "john@acme.example"),
        ("money", "$12.50"),
        ("date", "2024-06-11"),
        ("phone", "+44 20 7946 0958"),
    }

    text = http.get(f"{url}/v1/jobs/{job_id}/results?format=csv", headers=headers).text
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == [
        "id", "label", "score", "score:sports", "score:food", "score:tech",
        "rating", "entities", "error",
    ]  # fmt: skip
    assert len(rows) == 4 and rows[1][1] == "food"
    assert json.loads(rows[1][7]) == records[0]["entities"]
