"""The losses by their config names (``methods.<name>.loss``), and the keyword arguments each
takes with the config schema's defaults: the registry that tools and tests ask for "the paper's
setting" of a loss (the config package knows nothing of losses)."""

from __future__ import annotations

import inspect

from pwopsd.config.schema import ConfigError, schema_defaults
from pwopsd.training.losses import eopd_loss, gkd_loss, opsd_loss, pwopsd_loss, reopold_loss, todi_loss

# The reference form of each loss, by its config name (``methods.<name>.loss``).
REFERENCE_LOSSES = {"opsd": opsd_loss, "pwopsd": pwopsd_loss, "eopd": eopd_loss, "reopold": reopold_loss,
                    "gkd": gkd_loss, "todi": todi_loss}


def loss_keywords(loss: str, **params) -> dict:
    """Keyword arguments of a loss's reference form (:data:`REFERENCE_LOSSES`) with the config schema's
    defaults: the loss's own parameters plus the shared distillation temperature (and the
    per-vocabulary clamp, for the losses whose function takes ``clip``); ``params`` override them."""
    train = schema_defaults("training")
    kw = {"temperature": train["temperature"]}
    if "clip" in inspect.signature(REFERENCE_LOSSES[loss]).parameters:
        kw["clip"] = train["clip"]
    kw.update(schema_defaults("methods", {"loss": loss})["params"])
    unknown = set(params) - set(kw) - ({"upcast"} if loss == "opsd" else set())
    if unknown:
        raise ConfigError(f"loss {loss}: unknown parameter(s) {', '.join(sorted(unknown))}")
    return {**kw, **params}
