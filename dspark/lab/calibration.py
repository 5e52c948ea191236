"""Choosing, checking and storing STS: what `python -m dspark.train calibrate` and `bench calibration` run.

The core fits the temperatures (dspark/calibration.py `fit_sts`); here they are kept only where
held-out rounds show they help (`select_sts`), measured per position with bootstrap intervals and the ECE's
noise floor (`position_metrics`), and stored as the `calibration` record of a JSON file (the drafter
checkpoint's twin, or for a shipped drafter a file under DSPARK_HOME: `train calibrate` never writes into
the package).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from dspark.calibration import auroc, ece, ece_rows, fit_sts
from dspark.checkpoint import CheckpointError, config_path
from dspark.device import generator_uniforms
from dspark.drafters import default_path
from dspark.lab import storage
from dspark.scheduler import prefix_survival, temperatures_and_offsets

FIT_PROMPTS = (40, 80)  # eval prompts [40, 80) per domain fit STS; benchmarks report on [0, 40)
MIN_SURVIVORS = 50  # fitting rounds that must reach a position before its temperature is trusted


def ece_noise_floor(pred: torch.Tensor, draws: int = 20, seed: int = 0) -> float:
    """Mean ECE of a *perfectly calibrated* predictor with these predictions: events drawn
    as Bernoulli(pred). ECE estimates are biased upwards by sampling noise; this is that
    bias at this sample size, the level below which a measured ECE means nothing."""
    if pred.numel() == 0:
        return float("nan")
    g = torch.Generator().manual_seed(seed)  # on the CPU, whatever pred's device: the same draws everywhere
    return sum(ece(pred, (generator_uniforms(tuple(pred.shape), g, pred.device, torch.float64) < pred).double())
               for _ in range(draws)) / draws  # fmt: skip


def select_sts(
    conf: torch.Tensor,
    events: torch.Tensor,
    mask: torch.Tensor,
    fit_rows: torch.Tensor | None = None,
    min_survivors: int = MIN_SURVIVORS,
    shifts: bool = True,
) -> tuple[torch.Tensor, list[str]]:
    """STS that cannot make things worse: (2, γ) temperatures and logit offsets ((γ,) temperatures
    without `shifts`) and, per position, why they were kept or not.

    They are fitted (`fit_sts`) on the rounds in `fit_rows` (default: every other round) and checked,
    left to right, on the others: position k's (T_k, b_k) is kept only if at least `min_survivors`
    fitting rounds reached position k (their drafts 1..k-1 all accepted), the held-out ECE of the
    prefix survival at k, with what was already chosen before k, is lower with it than with the head
    as trained (T = 1, b = 0), and that gain is not lost at the later positions, whose products it also
    scales: the held-out ECE summed over positions k..γ (later ones as trained) is lower too. Otherwise
    position k keeps T = 1, b = 0."""
    rows = torch.arange(conf.shape[0], device=conf.device)
    fit_rows = rows % 2 == 0 if fit_rows is None else fit_rows
    check = ~fit_rows
    temps = fit_sts(conf[fit_rows], events[fit_rows], mask[fit_rows], shifts=shifts)
    fitted = torch.stack(temperatures_and_offsets(temps))  # (2, γ)
    chosen = torch.stack([torch.ones_like(fitted[0]), torch.zeros_like(fitted[1])])
    reasons = []
    for k in range(conf.shape[1]):
        reached = mask[fit_rows, k] & (events[fit_rows, k - 1].bool() if k else True)
        m = mask[check, k]
        what = f"T = {float(fitted[0, k]):.3f}" + (f", b = {float(fitted[1, k]):+.3f}" if shifts else "")
        if int(reached.sum()) < min_survivors:
            reasons.append(f"T = 1: only {int(reached.sum())} fitting rounds reach position {k + 1}")
            continue
        trial = chosen.clone()
        trial[:, k] = fitted[:, k]
        held_out = [prefix_survival(conf[check], t) for t in (chosen, trial)]  # later positions as trained
        before, after = (ece(a[m, k], events[check][m, k]) for a in held_out)
        if not after < before:
            reasons.append(
                f"T = 1: {what} does not lower held-out ECE ({100 * after:.1f}% vs {100 * before:.1f}%)"
            )
            continue
        # it also moves every later prefix product: what it gains at k must not be lost there
        later = [[ece(a[mask[check, j], j], events[check][mask[check, j], j]) for j in range(k + 1, conf.shape[1])]
                 for a in held_out]  # fmt: skip
        worse = [(j, old, new) for j, (old, new) in enumerate(zip(*later), start=k + 2) if new > old]
        if before + sum(later[0]) <= after + sum(later[1]):
            j, old, new = worse[0]
            reasons.append(f"T = 1: {what} lowers held-out ECE at {k + 1} but raises it at {len(worse)} later "
                           f"position(s) (at {j}: {100 * new:.2f}% vs {100 * old:.2f}%) by more in all")  # fmt: skip
            continue
        chosen[:, k] = fitted[:, k]
        reasons.append(f"{what}: held-out ECE {100 * before:.1f}% -> {100 * after:.1f}%")
    return (chosen if shifts else chosen[0]), reasons


def ece_change_interval(
    before: torch.Tensor, after: torch.Tensor, obs: torch.Tensor, draws: int = 200, seed: int = 0
) -> tuple[float, float]:
    """95% bootstrap interval of ECE(after) - ECE(before) over the same rounds (resampled together):
    whether a calibration really changed the ECE, or only moved it within the sampling noise."""
    if obs.numel() == 0:
        return float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, obs.numel(), (draws, obs.numel()), generator=g, device="cpu").to(
        obs.device
    )  # (D, n)
    changes = (ece_rows(after[picks], obs[picks]) - ece_rows(before[picks], obs[picks])).sort().values
    return float(changes[int(0.025 * draws)]), float(changes[int(0.975 * draws) - 1])


def position_metrics(
    conf: torch.Tensor, events: torch.Tensor, mask: torch.Tensor, temperatures: torch.Tensor | None
) -> list[dict]:
    """Per position k: ECE before (raw) and after (with `temperatures`), the 95% bootstrap interval of
    their difference, the ECE noise floor, AUROC and Brier after."""
    raw, cal = prefix_survival(conf), prefix_survival(conf, temperatures)
    rows = []
    for k in range(conf.shape[1]):
        m = mask[:, k]
        y = events[m, k]
        rows.append({"k": k + 1, "rounds": int(m.sum()), "survival_rate": float(y.mean()) if len(y) else None,
                     "ece_before": ece(raw[m, k], y), "ece_after": ece(cal[m, k], y),
                     "ece_change_95": ece_change_interval(raw[m, k], cal[m, k], y),
                     "ece_noise_floor": ece_noise_floor(cal[m, k]),
                     "auroc": auroc(cal[m, k], y), "brier": float(((cal[m, k] - y) ** 2).mean()) if len(y) else None})  # fmt: skip
    return rows


def describe_sts(temperatures: torch.Tensor) -> str:
    """'T 1.00 1.26 ...' (and '; b +0.10 ...' with logit offsets) for logs and tables."""
    temps, offsets = temperatures_and_offsets(temperatures)
    text = "T " + " ".join(f"{float(t):.2f}" for t in temps)
    return text + ("; b " + " ".join(f"{float(b):+.2f}" for b in offsets) if temperatures.dim() == 2 else "")


def save_temperatures(drafter_path: str | Path, temperatures: torch.Tensor, info: dict) -> Path:
    """Store the STS temperatures (γ,) -- or temperatures and logit offsets (2, γ) -- as the `calibration`
    record (`sts_temperatures`, `sts_shifts`, then `info`) of a JSON file: the drafter checkpoint's twin, or a
    calibration file of its own (created when missing; `calibration_path` below).
    Returns the file written."""
    path = config_path(drafter_path)
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); store the calibration in a new file") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not an object; store the calibration "
                         "in a new file")  # fmt: skip
    temps, offsets = temperatures_and_offsets(temperatures)
    stored = {"sts_temperatures": [round(float(t), 5) for t in temps]}
    if temperatures.dim() == 2:
        stored["sts_shifts"] = [round(float(b), 5) for b in offsets]
    record["calibration"] = {**stored, **info}
    storage.write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    return path


def checkpoint_digest(path: str | Path) -> str:
    """SHA-256 of a drafter's weights (of every file of an exported folder): which checkpoint a calibration under
    DSPARK_HOME was fitted for."""
    path = Path(path)
    digest = hashlib.sha256()
    for file in sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def calibration_path(checkpoint: str | Path, target_name: str = "tiny") -> Path:
    """Where `train calibrate` stores the calibration of the drafter at `checkpoint` (and readers look first):
    for a drafter shipped in the package, which the commands never write, DSPARK_HOME/calibration/<stem>.json
    (DSPARK_HOME/<target>/calibration/... for a named pretrained target); for any other, its JSON twin."""
    checkpoint = Path(checkpoint)
    if storage.inside_package(checkpoint):
        return storage.target_home(target_name) / "calibration" / f"{checkpoint.stem}.json"
    return config_path(checkpoint)


def drafted_positions(checkpoint: Path) -> int | None:
    """The block size a drafter checkpoint's config declares (`gamma`, or `max_gamma`), None if unreadable."""
    try:
        config = json.loads(config_path(checkpoint).read_text(encoding="utf-8"))["config"]
        positions = config.get("gamma", config.get("max_gamma"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return positions if isinstance(positions, int) and not isinstance(positions, bool) else None


def stored_calibration(path: str | Path) -> dict | None:
    """The `calibration` record of the JSON at `path` (or of its twin); None when there is none."""
    twin = config_path(path)
    if not twin.is_file():
        return None
    try:
        record = json.loads(twin.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{twin} is not valid JSON ({exc})") from None
    stored = record.get("calibration") if isinstance(record, dict) else None
    if stored is not None and not isinstance(stored, dict):
        raise CheckpointError(f"{twin}: 'calibration' must be a JSON object, got {type(stored).__name__}")
    return stored


def finite_list(twin: Path, field: str, values, positive: bool) -> list[float]:
    """`values` as floats if it is a list of finite numbers (> 0 with `positive`), else a one-line error."""
    if not isinstance(values, list) or not values:
        raise CheckpointError(f"{twin}: {field} must be a non-empty list of numbers, got {values!r}")
    for k, v in enumerate(values, start=1):
        finite = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not finite or (positive and v <= 0):
            need = "finite numbers > 0" if positive else "finite numbers"
            raise CheckpointError(f"{twin}: {field} must be {need}, got {v!r} at position {k}")
    return [float(v) for v in values]


def load_calibration(path: str | Path, positions: int | None = None) -> torch.Tensor | None:
    """The stored STS calibration: (γ,) temperatures or (2, γ) temperatures and offsets, None if there is
    none; anything but finite temperatures > 0 and `positions` of each is a `CheckpointError`."""
    stored = stored_calibration(path)
    if stored is None or stored.get("sts_temperatures") is None:
        return None
    twin = config_path(path)
    temps = finite_list(twin, "sts_temperatures", stored["sts_temperatures"], positive=True)
    shifts = stored.get("sts_shifts")
    if shifts is not None:
        shifts = finite_list(twin, "sts_shifts", shifts, positive=False)
        if len(shifts) != len(temps):
            raise CheckpointError(
                f"{twin}: sts_shifts has {len(shifts)} entries, sts_temperatures {len(temps)}"
            )
    if positions is not None and len(temps) != positions:
        raise CheckpointError(
            f"{twin}: the calibration has {len(temps)} positions but the drafter drafts "
            f"{positions}; run `python -m dspark.train calibrate` for this drafter again"
        )
    return torch.tensor(temps if shifts is None else [temps, shifts], dtype=torch.float64)


def find_calibration(
    checkpoint: str | Path, target_name: str = "tiny", positions: int | None = None
) -> torch.Tensor | None:
    """The calibration of the drafter at `checkpoint`, checked for its `positions` (default: the block size of
    its config): for a shipped drafter the one under DSPARK_HOME when it was fitted for these weights (a file
    left from before the drafter was retrained is passed over), else the one shipped with it."""
    checkpoint = Path(checkpoint)
    positions = positions if positions is not None else drafted_positions(checkpoint)
    home = calibration_path(checkpoint, target_name)
    if home != config_path(checkpoint):
        stored = stored_calibration(home)
        digest = stored.get("checkpoint_sha256") if stored else None
        if stored is not None and (digest is None or digest == checkpoint_digest(checkpoint)):
            found = load_calibration(home, positions)
            if found is not None:
                return found
    return load_calibration(checkpoint, positions)


def get_calibration(
    name: str, path: str | Path | None = None, target_name: str = "tiny", positions: int | None = None
) -> torch.Tensor | None:
    """STS temperatures of the drafter `name` at `path` (default: the one shipped for `target_name`), found
    and checked by `find_calibration` (DSPARK_HOME's first); None for `none` or a drafter never calibrated."""
    if name in ("none", "prompt-lookup"):
        return None
    return find_calibration(Path(path) if path else default_path(name, target_name), target_name, positions)
