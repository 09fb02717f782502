"""The fleet's vocabulary: the names every room shares (lanes, tasks, account types,
model kinds, the default labels, the fault markers), kept apart from the settings that
read the environment so that a module needing a name imports no settings machinery."""

ACCOUNT_TYPES = ("demo", "trial", "standard", "enterprise")
LANES = ("cpu", "gpu")
# How a job ends (db/models.py; the metrics declare a series for each, core/obs/metrics.py).
FINAL_JOB_STATUSES = ("succeeded", "partial", "failed", "cancelled")
# LANEWAY_PRECISION: auto, or one of the number formats inference/precision.py loads.
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# Each lane's interactive queue is this prefix and the lane's name.
INTERACTIVE_PREFIX = "interactive."
# The queues whose workers run their model on a GPU (pinned to one device).
GPU_QUEUES = frozenset({"gpu", INTERACTIVE_PREFIX + "gpu"})
DEFAULT_LABELS = (
    "billing",
    "shipping and delivery",
    "product quality",
    "account and login",
    "technical problem",
    "praise",
    "cancellation and refund",
)


TASKS = ("classify", "score", "extract", "embed")
MODEL_KINDS = ("embedding", "sequence-classification", "token-classification")
# Which model kinds can serve each task; an embedding model serves classify and score
# zero-shot (against the job's labels, or against two anchor descriptions).
TASK_MODEL_KINDS = {
    "classify": ("embedding", "sequence-classification"),
    "score": ("embedding", "sequence-classification"),
    "extract": ("token-classification",),
    "embed": ("embedding",),
}
DEFAULT_MODEL = "minilm"
# Faults a test may inject (LANEWAY_FAULTS); production leaves it empty.
FAULTS = ("poison", "stall")
POISON_MARKER = "__laneway_poison__"
STALL_MARKER = "__laneway_stall__"
MIB = 1024 * 1024
