"""Write <work>/REPORT.md from every run's log.jsonl and track.json (see README.md for the definitions).

    python report.py [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runs import RUNS  # noqa: E402

GAP = 0.5  # nats: the loss "shows" a failure at the first logged step this far above the twin


def read_log(folder):
    p = folder / "log.jsonl"
    if not p.exists():
        return None
    return {r["step"]: r for r in map(json.loads, p.read_text().splitlines()) if r}


def finite(v):
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def loss_shows(bad, good):
    """First logged step where the failing run's 10-step-mean training loss or held-out loss is
    non-finite or >= GAP nats above its twin's at the same step; None if never."""
    for step in sorted(bad):
        b = bad[step]
        if not finite(b["loss"]) or not finite(b["val_loss"]):
            return step, "non-finite"
        g = good.get(step)
        if g is None:
            continue
        if b["loss"] - g["loss"] >= GAP:
            return step, f"train +{b['loss'] - g['loss']:.2f}"
        if b["val_loss"] - g["val_loss"] >= GAP:
            return step, f"val +{b['val_loss'] - g['val_loss']:.2f}"
    return None, None


def findings(doc, levels):
    """(step, level, name) of every flag at the given levels, first occurrence of each name."""
    seen, out = set(), []
    for rec in doc.get("records", []):
        for f in rec.get("flags") or []:
            lv = str(f.get("level", "")).lower()
            if lv in levels and f.get("name") not in seen:
                seen.add(f.get("name"))
                out.append((rec.get("step"), lv, f.get("name")))
    return out


def alarm_names(doc):
    """Names of every flag raised at error or warning level anywhere on a run."""
    return {nm for _, _, nm in findings(doc, {"error", "warning"})}


def first_error(doc, exclude=frozenset()):
    """The first record with an error-level flag whose name is not in `exclude` (the findings the healthy twin also
    raises), and those flags."""
    for rec in doc.get("records", []):
        errs = [f for f in rec.get("flags") or []
                if str(f.get("level", "")).lower() == "error" and f.get("name") not in exclude]
        if errs:
            return rec, errs
    return None, []


def fmt(v, nd=2):
    return "—" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind16"))
    a = ap.parse_args(argv)
    work = Path(a.work)
    logs, docs = {}, {}
    for n in RUNS:
        logs[n] = read_log(work / n)
        t = work / n / "track.json"
        docs[n] = json.loads(t.read_text()) if t.exists() else None

    L = ["# Blind benchmark 16: report", "",
         f"Work folder: `{work}`. Definitions in `benchmarks/blind16/README.md`: *loss shows* = first "
         f"logged step (every 10) where the failing run's 10-step-mean training loss or its held-out "
         f"loss is non-finite or at least {GAP} nats above its healthy twin's at the same step; "
         "*twin's findings* = every finding name the healthy twin raises at warning or error level anywhere in its "
         "run; *first ERROR* = first Watch record of the failing run with an error-level flag whose name is NOT "
         "among its twin's findings (a finding shared with the twin is a false alarm of the twin, not a catch); "
         "*caught in time* = that first ERROR at or before *loss shows* (a failure the loss never shows: caught if "
         "there is any such ERROR at all); *right cause* = the top cause of that record's diagnosis equals the "
         "expected cause.", ""]

    # ------------------------------------------------------------------ failing runs
    L += ["## Failing runs", "",
          "| run | expected cause | first ERROR not shared with the twin (step: finding) | ERROR findings shared "
          "with the twin (not counted) | first_sign | loss shows at | caught in time | top diagnosis cause at first "
          "ERROR | right cause | final val (run / twin) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    n_fail = caught = right = 0
    missing = []
    for n, spec in RUNS.items():
        if not spec["bug"]:
            continue
        bad, good, doc = logs[n], logs[spec["twin"]], docs[n]
        if bad is None or good is None or doc is None:
            missing.append(n)
            L.append(f"| {n} | {spec['expected']} | (not trained / not evaluated) | | | | | | | |")
            continue
        n_fail += 1
        shows, why = loss_shows(bad, good)
        twin_doc = docs[spec["twin"]]
        exclude = alarm_names(twin_doc) if twin_doc is not None else set()
        shared = sorted({nm for _, lv, nm in findings(doc, {"error"}) if nm in exclude})
        rec, errs = first_error(doc, exclude)
        err_step = rec.get("step") if rec else None
        fs = doc.get("first_sign") or {}
        fs_txt = f"{fs.get('step')}: {fs.get('name')} ({fs.get('level')})" if fs else "none"
        if rec is None:
            ok = False
        elif shows is None:
            ok = True
        else:
            ok = err_step <= shows
        diag = (rec or {}).get("diagnosis") or []
        top = diag[0].get("cause") if diag else None
        is_right = top == spec["expected"]
        caught += ok
        right += is_right
        last = max(bad)
        fv = f"{fmt(bad[last]['val_loss'])} / {fmt(good.get(last, {}).get('val_loss'))}"
        err_txt = f"{err_step}: " + ", ".join(sorted({e.get('name') for e in errs})) if rec else "none"
        shows_txt = f"{shows} ({why})" if shows is not None else "never"
        shared_txt = ", ".join(shared) or "none"
        if twin_doc is None:
            shared_txt += " (twin not evaluated: nothing excluded)"
        L.append(f"| {n} | {spec['expected']} | {err_txt} | {shared_txt} | {fs_txt} | {shows_txt} | "
                 f"{'yes' if ok else 'no'} | {top or '—'} | {'yes' if is_right else 'no'} | {fv} |")

    # ------------------------------------------------------------------ healthy runs
    L += ["", "## Healthy runs (every ERROR or WARNING is a false alarm)", "",
          "| run | what | false alarms (first step: level name) | final loss / val |", "|---|---|---|---|"]
    n_healthy = alarmed = alarms = 0
    for n, spec in RUNS.items():
        if spec["bug"]:
            continue
        lg, doc = logs[n], docs[n]
        if lg is None or doc is None:
            missing.append(n)
            L.append(f"| {n} | {spec['what']} | (not trained / not evaluated) | |")
            continue
        n_healthy += 1
        fa = findings(doc, {"error", "warning"})
        alarms += len(fa)
        alarmed += bool(fa)
        last = max(lg)
        txt = "; ".join(f"{s}: {lv} {nm}" for s, lv, nm in fa) or "none"
        L.append(f"| {n} | {spec['what']} | {txt} | {fmt(lg[last]['loss'])} / {fmt(lg[last]['val_loss'])} |")

    # ------------------------------------------------------------------ warnings on failing runs (context)
    L += ["", "## Warnings and errors raised on failing runs (context; * = also raised on the healthy twin)", ""]
    for n, spec in RUNS.items():
        if spec["bug"] and docs[n] is not None:
            fa = findings(docs[n], {"error", "warning"})
            tw = alarm_names(docs[spec["twin"]]) if docs[spec["twin"]] is not None else set()
            L.append(f"- {n}: " + ("; ".join(f"{s}: {lv} {nm}{'*' if nm in tw else ''}" for s, lv, nm in fa) or "none"))

    L += ["", "## Totals", "",
          f"- failing runs evaluated: {n_fail}",
          f"- caught in time (by a finding not shared with the twin): {caught} / {n_fail}",
          f"- right cause (top diagnosis at the first ERROR): {right} / {n_fail}",
          f"- healthy runs evaluated: {n_healthy}; with any false alarm: {alarmed}; "
          f"false alarms (distinct findings at warning or error level): {alarms}"]
    if missing:
        L.append(f"- missing (not trained or not evaluated): {', '.join(missing)}")
    out = work / "REPORT.md"
    out.write_text("\n".join(L) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
