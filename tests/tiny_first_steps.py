"""The tiny build's first N pretraining steps on T threads, in a process of its own pinned as a
tiny-mode job is (the config's ``cpu_matmul`` and ``cpu_kernel_path``, set before torch starts, as
the Snakefile sets them), without dev checks: prints the weights' fingerprint (as the build report
records it after its first steps), the last loss, the threads and the kernel path as one JSON line.
tests/test_first_steps.py compares two threads with the digest's build and one thread with two.

    python tests/tiny_first_steps.py STEPS THREADS
"""

import json
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from pwopsd.config import load_config  # noqa: E402
from pwopsd.runtime import pin_kernel_path, pin_matmul  # noqa: E402

config = load_config(REPO / "tiny" / "config" / "config.yaml")
pin_matmul(config["cpu_matmul"])
pin_kernel_path(config["cpu_kernel_path"])

import torch  # noqa: E402

from pwopsd import settings  # noqa: E402
from pwopsd.runtime import set_threads  # noqa: E402
from pwopsd.tiny import examples as E  # noqa: E402
from pwopsd.tiny import model as M  # noqa: E402

steps, threads = int(sys.argv[1]), int(sys.argv[2])
cfg = E.TinyBuildConfig.from_dict(settings.tiny_model(config, types.SimpleNamespace(model="tiny_qwen3")))
object.__setattr__(cfg, "max_steps", steps)
M.is_check_step = lambda done, cfg: False  # the first steps only: no dev check, no stop
set_threads(threads)
tokenizer = E.tiny_tokenizer(cfg)
model = M.build_model(cfg, tokenizer)
result = M.pretrain(model, tokenizer, cfg, log_every=10**9)
print(json.dumps({"steps": len(result.losses), "loss": result.losses[-1], "hash": M.weights_fingerprint(model),
                  "threads": torch.get_num_threads(), "capability": torch.backends.cpu.get_cpu_capability()}))
