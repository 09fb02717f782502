import pytest

from laneway.settings import DEFAULT_LABELS, Settings, SettingsError


def test_nothing_set_means_the_embedded_default(tmp_path):
    s = Settings.from_env({"LANEWAY_HOME": str(tmp_path)})
    assert s.database_url == f"sqlite:///{tmp_path / 'laneway.db'}"
    assert s.embedded_redis and s.redis_url == f"redis+socket://{tmp_path / 'redis.sock'}"
    assert (s.chunk_size, s.gpu_threshold, s.gpu_fallback) == (256, 500, "")
    assert s.default_labels == DEFAULT_LABELS


def test_urls_select_postgres_through_psycopg3_and_external_redis():
    s = Settings.from_env(
        {
            "LANEWAY_DATABASE_URL": "postgresql://u:p@db:5432/laneway",
            "LANEWAY_REDIS_URL": "redis://cache:6379/2",
            "LANEWAY_CHUNK_SIZE": "64",
            "LANEWAY_GPU_THRESHOLD": "0",
            "LANEWAY_GPU_FALLBACK": "cpu",
        }
    )
    assert s.database_url == "postgresql+psycopg://u:p@db:5432/laneway"
    assert not s.embedded_redis and s.redis_url == "redis://cache:6379/2"
    assert (s.chunk_size, s.gpu_threshold, s.gpu_fallback) == (64, 0, "cpu")


@pytest.mark.parametrize(
    "var,value",
    [
        ("LANEWAY_CHUNK_SIZE", "lots"),
        ("LANEWAY_CHUNK_SIZE", "0"),
        ("LANEWAY_GPU_THRESHOLD", "-5"),
        ("LANEWAY_GPU_FALLBACK", "gpu"),
        ("LANEWAY_DATABASE_URL", "mysql://x/y"),
        ("LANEWAY_REDIS_URL", "http://localhost"),
        ("LANEWAY_DEFAULT_LABELS", "only-one"),
        ("LANEWAY_TORCH_THREADS", "2.5"),
    ],
)
def test_malformed_settings_name_the_variable(var, value):
    with pytest.raises(SettingsError, match=var):
        Settings.from_env({var: value})


def test_model_registry_and_task_models(tmp_path):
    import json

    model_dir = tmp_path / "sentiment"
    model_dir.mkdir()
    s = Settings.from_env(
        {
            "LANEWAY_MODELS": json.dumps(
                {"sentiment": {"kind": "sequence-classification", "path": str(model_dir)}}
            ),
            "LANEWAY_SCORE_MODEL": "sentiment",
            "LANEWAY_CPU_PRICE": "0.001",
        }
    )
    assert s.model_for("score").name == "sentiment"
    assert s.model_for("classify").name == "minilm" and s.model_for("classify").kind == "embedding"
    assert s.model_for("extract") is None  # patterns only
    assert s.cpu_price == 0.001 and s.gpu_price == 0.0015


@pytest.mark.parametrize(
    "env,message",
    [
        ({"LANEWAY_MODELS": "{nope"}, "LANEWAY_MODELS must be a JSON object"),
        ({"LANEWAY_MODELS": '{"x": {"kind": "llm", "path": "/"}}'}, r"LANEWAY_MODELS\['x'\].kind"),
        ({"LANEWAY_MODELS": '{"x": {"kind": "embedding", "path": "/no/such"}}'}, "path"),
        ({"LANEWAY_EXTRACT_MODEL": "ghost"}, "LANEWAY_EXTRACT_MODEL names 'ghost'"),
        ({"LANEWAY_EXTRACT_MODEL": "minilm"}, "extract needs token-classification"),
        ({"LANEWAY_CLASSIFY_MODEL": ""}, "LANEWAY_CLASSIFY_MODEL must name a model"),
        ({"LANEWAY_SCORE_ANCHORS": "only one"}, "LANEWAY_SCORE_ANCHORS"),
        ({"LANEWAY_GPU_PRICE": "free"}, "LANEWAY_GPU_PRICE"),
        ({"LANEWAY_CUDA_HALF": "maybe"}, "LANEWAY_CUDA_HALF"),
    ],
)
def test_bad_registry_settings_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_model_path_names_the_default_models_directory(tmp_path):
    assert Settings.from_env({"LANEWAY_MODEL_PATH": str(tmp_path)}).models["minilm"].path == str(
        tmp_path
    )
    with pytest.raises(SettingsError, match="LANEWAY_MODEL_PATH"):
        Settings.from_env({"LANEWAY_MODEL_PATH": str(tmp_path / "missing")})
