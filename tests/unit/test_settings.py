import pytest

from core.config.settings import Settings, SettingsError
from core.vocab import DEFAULT_LABELS


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
        ("LANEWAY_ROUTING", "cheapest"),
        ("LANEWAY_GPU_SCALE_DOWN", "keda"),
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
        # Nested past the parser's stack: the variable named, not a RecursionError.
        ({"LANEWAY_MODELS": "[" * 100_000 + "]" * 100_000}, "LANEWAY_MODELS is nested too"),
        ({"LANEWAY_MODELS": '{"x":' * 100_000 + "1" + "}" * 100_000}, "LANEWAY_MODELS is nest"),
        ({"LANEWAY_MODELS": '{"x": {"kind": "llm", "path": "/"}}'}, r"LANEWAY_MODELS\['x'\].kind"),
        ({"LANEWAY_MODELS": '{"x": {"kind": "embedding", "path": "/no/such"}}'}, "path"),
        ({"LANEWAY_EXTRACT_MODEL": "ghost"}, "LANEWAY_EXTRACT_MODEL names 'ghost'"),
        ({"LANEWAY_EXTRACT_MODEL": "minilm"}, "extract needs token-classification"),
        ({"LANEWAY_CLASSIFY_MODEL": ""}, "LANEWAY_CLASSIFY_MODEL must name a model"),
        ({"LANEWAY_SCORE_ANCHORS": "only one"}, "LANEWAY_SCORE_ANCHORS"),
        ({"LANEWAY_GPU_PRICE": "free"}, "LANEWAY_GPU_PRICE"),
        ({"LANEWAY_CUDA_HALF": "maybe"}, "LANEWAY_CUDA_HALF"),
        ({"LANEWAY_PRECISION": "int8"}, "LANEWAY_PRECISION must be one of auto, fp32"),
        ({"LANEWAY_PRECISION": "bfloat16"}, "LANEWAY_PRECISION"),
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


def test_reliability_settings_and_their_derived_timeouts():
    s = Settings.from_env(
        {
            "LANEWAY_CHUNK_TIMEOUT": "30",
            "LANEWAY_CHUNK_TIMEOUT_GPU": "120",
            "LANEWAY_RECONCILE_INTERVAL": "5",
            "LANEWAY_LANE_LIMIT_GPU": "50",
            "LANEWAY_FAULTS": "poison, Stall",
            "LANEWAY_ALERT_WEBHOOK_URL": "https://hooks.example/services/T/B/x",
        }
    )
    assert (s.chunk_timeout_for("cpu"), s.chunk_timeout_for("gpu")) == (30, 120)
    assert s.longest_chunk_timeout == 120
    assert (s.lane_limit("cpu"), s.lane_limit("gpu")) == (2000, 50)
    assert s.faults == ("poison", "stall") and s.redispatch_after == 30
    assert "hooks.example" not in repr(s)  # the webhook URL is a secret


@pytest.mark.parametrize(
    "var,value",
    [
        ("LANEWAY_FAULTS", "poison,meteor"),
        ("LANEWAY_ALERT_WEBHOOK_URL", "ftp://x"),
        ("LANEWAY_CHUNK_TIMEOUT_GPU", "2"),
        ("LANEWAY_MAX_CHUNK_ATTEMPTS", "0"),
        ("LANEWAY_LANE_LIMIT_CPU", "none"),
    ],
)
def test_malformed_reliability_settings_name_the_variable(var, value):
    with pytest.raises(SettingsError, match=var):
        Settings.from_env({var: value})


def test_account_limits_per_type_and_their_ceilings():
    s = Settings.from_env({})
    assert s.limits_for("standard").rate_limit == "1000/minute"
    assert s.limits_for("demo").max_items < s.limits_for("trial").max_items < s.max_items
    assert s.limits_for("enterprise").max_upload_bytes == s.max_upload_bytes
    s = Settings.from_env(
        {
            "LANEWAY_MAX_ITEMS": "50",
            "LANEWAY_RATE_LIMIT_TRIAL": "10/second;200/hour",
            "LANEWAY_MAX_UPLOAD_BYTES_DEMO": "4096",
            "LANEWAY_RATE_LIMIT_ANONYMOUS": "5/minute",
        }
    )
    # A default above a lowered ceiling follows the ceiling.
    assert {s.limits_for(t).max_items for t in ("demo", "trial", "standard")} == {50}
    assert s.limits_for("trial").rate_limit == "10/second;200/hour"
    assert s.limits_for("demo").max_upload_bytes == 4096
    assert s.anonymous_rate_limit == "5/minute"


@pytest.mark.parametrize(
    "env,message",
    [
        ({"LANEWAY_RATE_LIMIT_STANDARD": "lots"}, "LANEWAY_RATE_LIMIT_STANDARD must be a rate"),
        ({"LANEWAY_RATE_LIMIT_ANONYMOUS": "5 per fortnight"}, "LANEWAY_RATE_LIMIT_ANONYMOUS"),
        ({"LANEWAY_MAX_ITEMS_DEMO": "0"}, "LANEWAY_MAX_ITEMS_DEMO must be at least 1"),
        (
            {"LANEWAY_MAX_ITEMS": "10", "LANEWAY_MAX_ITEMS_ENTERPRISE": "20"},
            r"LANEWAY_MAX_ITEMS_ENTERPRISE \(20\) is above LANEWAY_MAX_ITEMS",
        ),
        ({"LANEWAY_MAX_UPLOAD_BYTES_TRIAL": "1e6"}, "LANEWAY_MAX_UPLOAD_BYTES_TRIAL"),
        ({"LANEWAY_SECRET_KEY": "short"}, "LANEWAY_SECRET_KEY must be at least 32"),
        ({"LANEWAY_SECURE_COOKIES": "sometimes"}, "LANEWAY_SECURE_COOKIES"),
    ],
)
def test_bad_security_settings_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_secret_key_and_cookie_settings():
    key = "k" * 40
    s = Settings.from_env({"LANEWAY_SECRET_KEY": key, "LANEWAY_SECURE_COOKIES": "false"})
    assert s.secret_key == key and s.secure_cookies is False
    assert key not in repr(s)
    assert Settings.from_env({}).secure_cookies is True


@pytest.mark.parametrize(
    "var,url",
    [
        ("LANEWAY_DATABASE_URL", "mysql://laneway:hunter2secret@db/laneway"),
        ("LANEWAY_REDIS_URL", "http://:hunter2secret@cache:6379/0"),
    ],
)
def test_a_rejected_url_is_named_without_its_password(var, url):
    with pytest.raises(SettingsError, match=var) as caught:
        Settings.from_env({var: url})
    assert "hunter2secret" not in str(caught.value) and ":***@" in str(caught.value)


def test_inbox_settings_and_their_defaults(tmp_path):
    s = Settings.from_env({"LANEWAY_HOME": str(tmp_path)})
    assert (s.inbox_dir, s.outbox_dir) == (tmp_path / "inbox", tmp_path / "outbox")
    assert (s.inbox_schedule, s.inbox_settle, s.inbox_tasks) == ("0 2 * * *", 60, ("classify",))
    assert (s.inbox_max_bytes, s.max_blank_lines) == (4 << 30, 10_000)
    s = Settings.from_env(
        {
            "LANEWAY_INBOX_DIR": str(tmp_path / "drop"),
            "LANEWAY_OUTBOX_DIR": str(tmp_path / "pickup"),
            "LANEWAY_INBOX_SCHEDULE": "*/5  1-3 * * mon-fri",
            "LANEWAY_INBOX_SETTLE": "0",
            "LANEWAY_INBOX_TASKS": "classify, score",
            "LANEWAY_INBOX_MAX_BYTES": "1048576",
            "LANEWAY_MAX_BLANK_LINES": "50",
        }
    )
    assert (s.inbox_dir, s.outbox_dir) == (tmp_path / "drop", tmp_path / "pickup")
    assert s.inbox_schedule == "*/5 1-3 * * mon-fri"
    assert (s.inbox_settle, s.inbox_tasks) == (0, ("classify", "score"))
    assert (s.inbox_max_bytes, s.max_blank_lines) == (1 << 20, 50)


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("LANEWAY_INBOX_SCHEDULE", "0 2 * *", "five fields"),
        ("LANEWAY_INBOX_SCHEDULE", "0 25 * * *", "not a valid crontab"),
        ("LANEWAY_INBOX_SCHEDULE", "0 0 31 2 *", "not a valid crontab"),
        ("LANEWAY_INBOX_SETTLE", "-1", "at least 0"),
        ("LANEWAY_INBOX_MAX_ITEMS", "many", "integer"),
        ("LANEWAY_INBOX_TASKS", "classify,translate", "distinct tasks"),
        ("LANEWAY_INBOX_MAX_BYTES", "0", "at least 1"),
        ("LANEWAY_MAX_BLANK_LINES", "lots", "integer"),
    ],
)
def test_malformed_inbox_settings_name_the_variable(var, value, message):
    with pytest.raises(SettingsError, match=f"{var}.*{message}"):
        Settings.from_env({var: value})


def test_an_inbox_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SettingsError, match="LANEWAY_INBOX_DIR must be a folder"):
        Settings.from_env({"LANEWAY_INBOX_DIR": str(tmp_path / "file")})


def test_the_model_cache_is_the_home_unless_named_and_never_a_file(tmp_path):
    home = tmp_path / "home"
    assert Settings.from_env({"LANEWAY_HOME": str(home)}).model_cache_dir == home
    shared = tmp_path / "shared" / ".." / "shared"  # resolved, as the other folders are
    named = {"LANEWAY_HOME": str(home), "LANEWAY_MODEL_CACHE_DIR": str(shared)}
    assert Settings.from_env(named).model_cache_dir == tmp_path / "shared"
    (tmp_path / "file").write_text("x")
    with pytest.raises(SettingsError, match="LANEWAY_MODEL_CACHE_DIR must be a folder"):
        Settings.from_env({"LANEWAY_MODEL_CACHE_DIR": str(tmp_path / "file")})


def test_interactive_settings_and_their_defaults():
    s = Settings.from_env({})
    assert (s.sync_max_items, s.sync_timeout, s.batch_max, s.batch_wait_ms) == (32, 2.0, 64, 50.0)
    assert (s.cache_ttl, s.batch_nice, s.interactive_lane) == (300, 10, "auto")
    assert s.batch_yield_max == 2.0
    assert Settings.from_env({"LANEWAY_BATCH_YIELD_MAX": "0"}).batch_yield_max == 0
    assert s.interactive_lanes == ()  # cpu, plus gpu where CUDA is
    assert s.embeddings_max_inputs == 2048
    assert Settings.from_env({"LANEWAY_EMBEDDINGS_MAX_INPUTS": "64"}).embeddings_max_inputs == 64
    s = Settings.from_env(
        {
            "LANEWAY_SYNC_MAX_ITEMS": "8",
            "LANEWAY_SYNC_TIMEOUT": "0.5",
            "LANEWAY_CACHE_TTL": "0",
            "LANEWAY_INTERACTIVE_LANE": "gpu",
            "LANEWAY_INTERACTIVE_LANES": "gpu, cpu",
            "LANEWAY_TORCH_THREADS": "2",
        }
    )
    assert (s.sync_max_items, s.sync_timeout, s.cache_ttl) == (8, 0.5, 0)
    assert (s.interactive_lane, s.interactive_lanes) == ("gpu", ("gpu", "cpu"))
    # Every worker, batch or interactive, loads with this many (batch ones give one back
    # at run time while interactive work runs: workers/cores.py).
    assert s.torch_threads == 2


def test_cache_scope_and_session_lifetime_settings():
    s = Settings.from_env({})
    assert (s.cache_shared, s.session_lifetime) == (False, 12 * 3600)
    s = Settings.from_env({"LANEWAY_CACHE_SHARED": "true", "LANEWAY_SESSION_LIFETIME": "900"})
    assert (s.cache_shared, s.session_lifetime) == (True, 900)
    with pytest.raises(SettingsError, match="LANEWAY_CACHE_SHARED must be true or false"):
        Settings.from_env({"LANEWAY_CACHE_SHARED": "maybe"})
    with pytest.raises(SettingsError, match="LANEWAY_SESSION_LIFETIME"):
        Settings.from_env({"LANEWAY_SESSION_LIFETIME": "5"})


@pytest.mark.parametrize(
    "var,value",
    [
        ("LANEWAY_SYNC_MAX_ITEMS", "0"),
        ("LANEWAY_EMBEDDINGS_MAX_INPUTS", "0"),
        ("LANEWAY_SYNC_TIMEOUT", "soon"),
        ("LANEWAY_SYNC_TIMEOUT", "-1"),
        ("LANEWAY_BATCH_MAX", "0"),
        ("LANEWAY_BATCH_WAIT_MS", "x"),
        ("LANEWAY_CACHE_TTL", "-1"),
        ("LANEWAY_BATCH_NICE", "20"),
        ("LANEWAY_BATCH_NICE", "-1"),
        ("LANEWAY_BATCH_YIELD_MAX", "-1"),
        ("LANEWAY_BATCH_YIELD_MAX", "never"),
        ("LANEWAY_INTERACTIVE_LANE", "tpu"),
        ("LANEWAY_INTERACTIVE_LANES", "cpu,tpu"),
        ("LANEWAY_INTERACTIVE_LANES", "cpu,cpu"),
        ("LANEWAY_INTERACTIVE_LANES", ","),
        ("LANEWAY_WEB_THREADS", "0"),
    ],
)
def test_malformed_interactive_settings_name_the_variable(var, value):
    with pytest.raises(SettingsError, match=var):
        Settings.from_env({var: value})


def test_served_model_names():
    assert Settings.from_env({}).served_model_names == ()
    s = Settings.from_env({"LANEWAY_SERVED_MODEL_NAMES": " embeddings , text-embedding-3-small,"})
    assert s.served_model_names == ("embeddings", "text-embedding-3-small")
    # The embedding model's own registry name is allowed (it changes nothing).
    assert Settings.from_env({"LANEWAY_SERVED_MODEL_NAMES": "minilm"}).served_model_names


@pytest.mark.parametrize(
    "value,message",
    [
        ("a,b,a", "twice"),
        ("my model", "without spaces"),
        ("x" * 129, "at most 128"),
        ("tab\there", "without spaces"),
        ("a?b", "URL path"),
        ("50%", "URL path"),
    ],
)
def test_malformed_served_model_names_name_the_variable(value, message):
    with pytest.raises(SettingsError, match=f"LANEWAY_SERVED_MODEL_NAMES.*{message}"):
        Settings.from_env({"LANEWAY_SERVED_MODEL_NAMES": value})


def test_a_served_name_may_not_be_another_registry_model(tmp_path):
    (tmp_path / "clf").mkdir()
    models = '{"clf": {"kind": "sequence-classification", "path": "%s"}}' % (tmp_path / "clf")
    with pytest.raises(SettingsError, match="LANEWAY_SERVED_MODEL_NAMES names clf, another"):
        Settings.from_env({"LANEWAY_MODELS": models, "LANEWAY_SERVED_MODEL_NAMES": "e,clf"})


def test_monitoring_settings_and_their_defaults():
    s = Settings.from_env({})
    assert (s.metrics, s.flower_port, s.flower_max_tasks, s.flower_url) == (True, 5555, 10000, "")
    s = Settings.from_env(
        {
            "LANEWAY_METRICS": "off",
            "LANEWAY_FLOWER_PORT": "6555",
            "LANEWAY_FLOWER_MAX_TASKS": "500",
            "LANEWAY_FLOWER_URL": "https://flower.example/",
        }
    )
    assert (s.metrics, s.flower_port, s.flower_max_tasks) == (False, 6555, 500)
    assert s.flower_url == "https://flower.example/"


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("LANEWAY_METRICS", "maybe", "true or false"),
        ("LANEWAY_FLOWER_PORT", "0", "at least 1"),
        ("LANEWAY_FLOWER_MAX_TASKS", "lots", "integer"),
        ("LANEWAY_FLOWER_URL", "flower:5555", "http"),
    ],
)
def test_malformed_monitoring_settings_name_the_variable(var, value, message):
    with pytest.raises(SettingsError, match=f"{var}.*{message}"):
        Settings.from_env({var: value})


def test_who_stops_idle_gpu_workers_is_apart_from_the_idle_time_routing_charges():
    from core.queueing.celery_app import celery_config
    from jobs.planner import Prices

    default = Settings.from_env({})
    assert default.gpu_scale_down == "beat" and default.beat_stops_gpu_workers
    scale_down = celery_config(default)["beat_schedule"]["scale-down"]
    assert scale_down["schedule"] == 30.0  # half the 300 s idle time, at most a reconcile's
    # Kubernetes: KEDA stops gpu pods after its cooldownPeriod; beat schedules no
    # scale-down, and routing still charges the idle time KEDA lets a pod run.
    keda = Settings.from_env(
        {"LANEWAY_GPU_SCALE_DOWN": "external", "LANEWAY_GPU_IDLE_TIMEOUT": "300"}
    )
    assert not keda.beat_stops_gpu_workers
    assert "scale-down" not in celery_config(keda)["beat_schedule"]
    assert Prices.of(keda).gpu_idle_timeout == 300
    never = Settings.from_env({"LANEWAY_GPU_IDLE_TIMEOUT": "0"})
    assert not never.beat_stops_gpu_workers and Prices.of(never).gpu_idle_timeout == 0


def test_precision_defaults_to_auto_and_reads_any_case():
    assert Settings().precision == "auto"
    assert Settings.from_env({"LANEWAY_PRECISION": " BF16 "}).precision == "bf16"
    assert Settings.from_env({"LANEWAY_PRECISION": ""}).precision == "auto"
    # The deprecated LANEWAY_CUDA_HALF stays readable next to it (inference.precision.choose).
    legacy = Settings.from_env({"LANEWAY_CUDA_HALF": "false"})
    assert (legacy.precision, legacy.cuda_half) == ("auto", False)


# --- read by pydantic-settings: what a hurried operator types ----------------------------


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("LANEWAY_SYNC_TIMEOUT", "nan", "must be a number"),
        ("LANEWAY_SYNC_TIMEOUT", "inf", "must be a number"),
        ("LANEWAY_CHUNK_SIZE", "1e3", "must be an integer"),
        ("LANEWAY_CHUNK_SIZE", "12 items", "must be an integer"),
        ("LANEWAY_CHUNK_SECONDS", "2s", "must be a number"),
        ("LANEWAY_CHUNK_SECONDS", "-1", "must be at least 0"),
        ("LANEWAY_CHUNK_SECONDS", "nan", "must be a number"),
        ("LANEWAY_MAX_CHUNK_SIZE", "0", "must be at least 1"),
        ("LANEWAY_MAX_CHUNK_SIZE", "2k", "must be an integer"),
        ("LANEWAY_AUTH_CACHE_SECONDS", "61", "at most 60"),
        ("LANEWAY_METRICS", "enabled", "true or false"),
        ("LANEWAY_ROUTING", "Cheapest", "must be one of measured, threshold"),
        ("LANEWAY_ACCOUNT_LIMITS", '{"demo": 1}', "LANEWAY_RATE_LIMIT_<TYPE>"),
    ],
)
def test_a_hurried_value_is_refused_naming_the_variable(var, value, message):
    with pytest.raises(SettingsError, match=f"{var}.*{message}"):
        Settings.from_env({var: value})


def test_chunk_sizing_settings_and_their_defaults():
    default = Settings.from_env({})
    assert (default.chunk_size, default.chunk_seconds, default.max_chunk_size) == (256, 1.0, 2048)
    off = Settings.from_env({"LANEWAY_CHUNK_SECONDS": "0", "LANEWAY_MAX_CHUNK_SIZE": "8192"})
    assert (off.chunk_seconds, off.max_chunk_size) == (0.0, 8192)
    # A chunk size above the ceiling (a configuration older than the ceiling) still starts:
    # the floor wins (jobs/planner.chunk_size_for).
    assert Settings.from_env({"LANEWAY_CHUNK_SIZE": "4096"}).chunk_size == 4096


def test_blank_values_mean_the_default_and_choices_ignore_case():
    s = Settings.from_env(
        {"LANEWAY_CHUNK_SIZE": "   ", "LANEWAY_DEVICE": " CPU ", "LANEWAY_METRICS": "OFF"}
    )
    assert (s.chunk_size, s.device, s.metrics) == (256, "cpu", False)


def test_derived_settings_cannot_be_set_by_a_variable(tmp_path):
    s = Settings.from_env({"LANEWAY_HOME": str(tmp_path), "LANEWAY_EMBEDDED_REDIS": "false"})
    assert s.embedded_redis and s.redis_url == f"redis+socket://{tmp_path / 'redis.sock'}"


def test_from_env_reads_only_the_mapping_it_is_given(monkeypatch):
    monkeypatch.setenv("LANEWAY_CHUNK_SIZE", "7")
    assert Settings.from_env({}).chunk_size == 256
    assert Settings.from_env().chunk_size == 7


def test_settings_are_frozen_and_replace_makes_a_changed_copy():
    s = Settings.from_env({})
    changed = s.replace(chunk_size=10)
    assert (s.chunk_size, changed.chunk_size) == (256, 10)
    with pytest.raises(ValueError, match="frozen"):
        s.chunk_size = 3


def test_a_bad_secret_is_named_but_never_echoed():
    secret = "https://hooks.example/services/T000/B000/s3cr3tT0ken"
    with pytest.raises(SettingsError, match="LANEWAY_ALERT_WEBHOOK_URL") as caught:
        Settings.from_env({"LANEWAY_ALERT_WEBHOOK_URL": secret.replace("https://", "ftp://")})
    assert "s3cr3tT0ken" not in str(caught.value)
    short = "tooshortsecret"
    with pytest.raises(SettingsError, match="LANEWAY_SECRET_KEY") as caught:
        Settings.from_env({"LANEWAY_SECRET_KEY": short})
    assert short not in str(caught.value)


@pytest.mark.parametrize(
    "value,expected", [(" TRUE ", True), ("Off", False), ("1", True), ("no", False)]
)
def test_a_switch_reads_as_it_always_did(value, expected):
    assert Settings.from_env({"LANEWAY_METRICS": value}).metrics is expected


@pytest.mark.parametrize("value", ["t", "f", "y", "n", "enabled"])
def test_a_switch_refuses_what_it_always_refused(value):
    with pytest.raises(
        SettingsError, match=f"LANEWAY_CACHE_SHARED must be true or false, got '{value}'"
    ):
        Settings.from_env({"LANEWAY_CACHE_SHARED": value})


def test_variable_names_match_as_the_shell_spells_them(monkeypatch):
    assert (
        Settings.from_env({"laneway_chunk_size": "7", "Laneway_Chunk_Size": "8"}).chunk_size == 256
    )
    monkeypatch.delenv("LANEWAY_CHUNK_SIZE", raising=False)
    monkeypatch.setenv("laneway_chunk_size", "7")
    assert Settings.from_env().chunk_size == 256


@pytest.mark.parametrize(
    "var,value,message",
    [
        ("LANEWAY_BATCH_NICE", "20", "LANEWAY_BATCH_NICE must be a niceness from 0 to 19, got 20"),
        ("LANEWAY_BATCH_NICE", "-1", "LANEWAY_BATCH_NICE must be at least 0, got -1"),
        (
            "LANEWAY_SESSION_LIFETIME",
            " 42 ",
            "LANEWAY_SESSION_LIFETIME must be at least 60, got 42$",
        ),
        ("LANEWAY_AUTH_CACHE_SECONDS", "1e2", r"at most 60.0, got 100.0$"),
        ("LANEWAY_CPU_WORKERS", "-1", "LANEWAY_CPU_WORKERS must be at least 0, got -1$"),
        (
            "LANEWAY_CPU_WORKERS",
            "many",
            "LANEWAY_CPU_WORKERS must be a count of workers \\(0 or more\\) or auto, got 'many'$",
        ),
        ("LANEWAY_CPU_WORKERS", "2.5", r"\(0 or more\) or auto, got '2.5'$"),
    ],
)
def test_an_out_of_bounds_number_is_quoted_as_read(var, value, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({var: value})


def test_the_broker_is_redis_unless_an_amqp_url_names_rabbitmq():
    from core.queueing.celery_app import celery_config

    redis_only = Settings.from_env({"LANEWAY_REDIS_URL": "redis://cache:6379/2"})
    assert redis_only.broker == "redis://cache:6379/2" and not redis_only.broker_is_rabbitmq
    config = celery_config(redis_only)
    assert config["broker_url"] == "redis://cache:6379/2"
    assert all(q.queue_arguments is None for q in config["task_queues"])
    assert "visibility_timeout" in config["broker_transport_options"]

    url = "amqp://laneway:secret@mq:5672/laneway"
    rabbit = Settings.from_env({"LANEWAY_REDIS_URL": "redis://cache:6379/2",
                                "LANEWAY_BROKER_URL": url})  # fmt: skip
    config = celery_config(rabbit)
    assert rabbit.broker_is_rabbitmq and config["broker_url"] == url
    assert config["result_backend"].endswith("+redis://cache:6379/2")  # results stay on Redis
    assert {q.name: q.queue_arguments for q in config["task_queues"]} == {
        name: {"x-queue-type": "quorum", "x-delivery-limit": rabbit.broker_delivery_limit}
        for name in ("cpu", "gpu", "maintenance", "interactive.cpu", "interactive.gpu")
    }
    assert config["broker_transport_options"] == {"confirm_publish": True}
    assert config["task_default_exchange_type"] == "topic"  # native delayed delivery
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]


@pytest.mark.parametrize("url", ["http://mq:5672", "amqp://", "mq:5672", "kafka://broker:9092"])
def test_a_bad_broker_url_stops_start_up_naming_it(url):
    with pytest.raises(SettingsError, match="LANEWAY_BROKER_URL"):
        Settings.from_env({"LANEWAY_BROKER_URL": url})


def test_cpu_workers_are_auto_unless_counted():
    assert Settings.from_env({}).cpu_workers == "auto"
    assert Settings.from_env({"LANEWAY_CPU_WORKERS": " AUTO "}).cpu_workers == "auto"
    assert Settings.from_env({"LANEWAY_CPU_WORKERS": "0"}).cpu_workers == 0  # none here
    assert Settings.from_env({"LANEWAY_CPU_WORKERS": " 3 "}).cpu_workers == 3
