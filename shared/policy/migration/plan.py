"""Plan assembly: intra-GPU moves on a Busy GPU, pulls into a Lazy one, and the ``Move`` records they add
to the plan (applied to the plan's virtual GPUs, so each move sees the previous ones done)."""

from __future__ import annotations

from shared.mig.geometry import Profile
from shared.mig.occupancy import span
from shared.policy.migration.moves import IntraMove, Move
from shared.policy.migration.pull import PullSearch
from shared.policy.migration.search import VirtualGpu
from shared.policy.snapshot import InstanceView


class _Plan(PullSearch):
    """One plan being built (see ``shared.policy.migration.planner`` for the rules and tie-breaks)."""

    # -- intra -------------------------------------------------------------------------------------------

    def best_intra(self, g: VirtualGpu) -> IntraMove | None:
        busy = g.busy_mask
        before = g.cost_q(busy)
        best: IntraMove | None = None
        for inst in g.insts:
            if not self.may_move(inst, inter=False) or not g.model.has_profile(inst.profile):
                continue
            prof = g.model.profile(inst.profile)
            base = busy & ~inst.mask
            for s in prof.placements:
                pm = span(prof.memory_slices, s)
                # make-before-break: the source's own slices are still busy while the copy starts
                if pm & busy or not g.count_ok(prof, pm):
                    continue
                change = g.cost_q(base | pm) - before
                if change >= 0:
                    continue
                ov = sum(i.size for i in g.in_the_way(pm))
                key = (change, ov, inst.start, -s, inst.job_id or "")
                if best is None or key < best[0]:
                    best = (key, inst, prof, s)
        return best

    def apply_intra(self, g: VirtualGpu, found: IntraMove,
                    why: str) -> None:
        _, inst, prof, s = found
        pm = span(prof.memory_slices, s)
        busy = g.busy_mask
        destroy = tuple(i.id for i in g.in_the_way(pm))
        fb, fa = g.tables.cost(busy), g.tables.cost((busy & ~inst.mask) | pm)
        self.moves.append(Move(
            job_id=inst.job_id or "", kind="intra", src_gpu=g.id, src_instance=inst.id,
            src_profile=inst.profile, src_start=inst.start, dst_gpu=g.id, dst_profile=prof.name, dst_start=s,
            dst_size=prof.memory_slices,
            destroy=destroy, frag_src_before=fb, frag_src_after=fa, frag_dst_before=fb, frag_dst_after=fa,
            expected_change=fa - fb,
            reason=f"{why}: {inst.profile}@{inst.start}->@{s} lowers FragCost {fb:.3f}->{fa:.3f}",
        ))
        self.moved.add(inst.job_id or "")
        g.take(inst)
        g.put(prof, s, inst, self.now)
        self._gpus[g.id] = g
        self.changed(g)

    def intra_on(self, g: VirtualGpu, why: str) -> None:
        while not self.full():
            found = self.best_intra(g)
            if found is None:
                return
            self.apply_intra(g, found, why)

    def pull_into(self, t: VirtualGpu, why: str) -> bool:
        """Plan one pull into Lazy ``t`` (the best-first search; ``tests/reference_migration.py`` is the
        exhaustive scan it is held to)."""
        if self.full() or self.busy_tier(t):
            return False
        if not self.params.pull_into_empty and t.busy_mask == 0:
            return False
        found = self.best_pull(t)
        if found is None:
            return False
        src_id, inst, prof, start = found
        self.apply_inter(self.gpu(src_id), inst, t, prof, start, why)
        return True

    def apply_inter(
        self, src: VirtualGpu, inst: InstanceView, t: VirtualGpu, prof: Profile, s: int, why: str
    ) -> None:
        pm = span(prof.memory_slices, s)
        sb, tb = src.busy_mask, t.busy_mask
        fsb, fsa = src.tables.cost(sb), src.tables.cost(sb & ~inst.mask)
        fdb, fda = t.tables.cost(tb), t.tables.cost(tb | pm)
        self.moves.append(Move(
            job_id=inst.job_id or "", kind="inter", src_gpu=src.id, src_instance=inst.id,
            src_profile=inst.profile, src_start=inst.start, dst_gpu=t.id, dst_profile=prof.name, dst_start=s,
            dst_size=prof.memory_slices, destroy=tuple(i.id for i in t.in_the_way(pm)),
            frag_src_before=fsb, frag_src_after=fsa, frag_dst_before=fdb, frag_dst_after=fda,
            expected_change=fsa - fsb,
            reason=(f"{why}: {inst.profile} from busy {src.id} (FragCost {fsb:.3f}->{fsa:.3f}) "
                    f"to lazy {t.id} {prof.name}@{s}"),
        ))
        self.moved.add(inst.job_id or "")
        src.take(inst)
        t.put(prof, s, inst, self.now)
        for g in (src, t):
            self._gpus[g.id] = g
            self.changed(g)
