"""FGD applied to MIG: the placement that least increases the GPU's expected unusable free slices under the
demand mix ``weights`` (shape -> share, see ``fragcost.frag_rate``). A baseline of ``baselines``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shared.mig.geometry import GpuModel, Profile
from shared.mig.occupancy import span
from shared.mig.tables import tables_for
from shared.policy.baseline_slots import (
    PlacementPolicy,
    UnknownPolicyError,
    cannot_place,
    column,
    count_ok,
    create_slot,
    explained,
    not_mig,
    reuse_slot,
    usable,
)
from shared.policy.fragcost import FGD_OFFSET, FGD_SCALE, fgd_create_table, frag_slices_table, weights_key
from shared.policy.placement import Decision, JobRequest
from shared.policy.request import resolve_profile
from shared.policy.snapshot import ClusterSnapshot


def fgd_policy(name: str, weights: Mapping[str, float]) -> PlacementPolicy:
    wkey = weights_key(weights)
    if not wkey:
        raise UnknownPolicyError(f"{name}: 'weights' needs at least one positive share")

    def policy(snap: ClusterSnapshot, job: JobRequest) -> Decision:
        if job.demand.kind != "mig":
            return not_mig(snap, job, name)
        best: tuple[int, int, GpuModel, Profile, str | None, int] | None = None
        excluded: set[int] = set()
        at_max = 0
        while True:
            counts: dict[str, int] = {f"{job.demand.label()} at its max count": at_max}
            best = None
            for model_name, pos in snap.groups.items():
                model = snap.models[model_name]
                prof = resolve_profile(job.demand, model)
                if prof is None:
                    counts[f"{model_name} has no profile for {job.demand.label()}"] = pos.size
                    continue
                ok = usable(snap, pos)
                if excluded:
                    ok &= ~np.isin(pos, list(excluded))
                counts["not in MIG mode or unhealthy"] = counts.get("not in MIG mode or unhealthy", 0) + int(
                    (~usable(snap, pos)).sum())
                start_t, d_t, o_t = fgd_create_table(model, prof.name, wkey)
                pair = (column(snap.busy)[pos].astype(np.intp) << 8) | column(snap.idle)[pos]
                start = start_t[pair]
                fits = ok & (start >= 0)
                if fits.any():
                    keys = ((d_t[pair] + FGD_OFFSET) << 37) + (1 << 36) + (o_t[pair] << 32) + pos
                    keys = np.where(fits, keys, np.iinfo(np.int64).max)
                    i = int(np.argmin(keys))
                    cand = (int(keys[i]), int(pos[i]), model, prof, None, int(start[i]))
                    if best is None or cand[:2] < best[:2]:
                        best = cand
                frag = frag_slices_table(model, dict(wkey))
                bit = np.uint32(1 << tables_for(model).index[prof.name])
                has = ok & ((column(snap.idle_profiles)[pos] & bit) != 0)
                counts[f"no free {prof.name} placement"] = int((ok & ~fits & ~has).sum())
                for p in pos[has].tolist():
                    gpu = snap.gpus[p]
                    for inst in gpu.instances:
                        if inst.busy or inst.profile != prof.name:
                            continue
                        d = round(float(frag[gpu.busy_mask | inst.mask] - frag[gpu.busy_mask]) * FGD_SCALE)
                        k = ((d + FGD_OFFSET) << 37) + p
                        cand = (k, p, model, prof, inst.id, inst.start)
                        if best is None or (cand[0], cand[1], -cand[5]) < (best[0], best[1], -best[5]):
                            best = cand
            if best is None:
                return cannot_place(job, name, counts)
            key, p, model, prof, inst_id, start = best
            gpu = snap.gpus[p]
            change = ((key >> 37) - FGD_OFFSET) / FGD_SCALE
            why = f"{name}: least increase of unusable free slices ({change:+.3f})"
            if inst_id is not None:
                return explained(snap, job, name, reuse_slot(gpu, model, inst_id), why)
            if count_ok(gpu, prof, span(prof.memory_slices, start)):
                return explained(snap, job, name, create_slot(gpu, model, prof, start), why)
            at_max += 1
            excluded.add(p)

    return policy
