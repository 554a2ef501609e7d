"""``MemoryState``'s migration transitions (mirror ``lua/migrate.lua``): reserve the target instance of a
move (compare-and-set on the destination GPU's version), then commit or abort it."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from shared.state.memory_prelude import MemoryPrelude
from shared.state.memory_slots import give_back
from shared.state.memory_slots import idle as _idle
from shared.state.model import PLAIN_PROFILES, StoredInstance


class MigrationTransitions(MemoryPrelude):
    """The migration transitions of ``MemoryState``."""

    def _t_migrate_reserve(
        self,
        job: str,
        src_instance: str,
        dst_gpu: str,
        dst_ver: int,
        inst: StoredInstance,
        destroy: Sequence[str],
        max_count: int,
        cooldown_s: float,
        reason: str,
        now: float,
    ) -> tuple[str, str]:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None or j.state != "running":
            return ("state", j.state if j else "")
        if j.inst != src_instance:
            return ("moved", j.inst)
        _, sg = self._gpu(j.gpu)
        _, dg = self._gpu(dst_gpu)
        src = next((x for x in sg.instances if x.id == j.inst), None) if sg else None
        if sg is None or src is None or src.job != job:
            return ("gone", j.inst)
        if not src.mig or src.profile in PLAIN_PROFILES or j.slots:
            return ("pinned", "")
        if src.moved > 0 and src.moved + cooldown_s > now:
            return ("cooldown", str(src.moved))
        if dg is None:
            return ("nogpu", dst_gpu)
        if dg.ver != dst_ver:
            return ("conflict", str(dg.ver))
        if not dg.healthy:
            return ("unhealthy", dst_gpu)
        if not dg.mig:
            return ("mode", dst_gpu)
        dinsts = copy.deepcopy(dg.instances)
        gone: list[StoredInstance] = []
        for did in destroy:
            i = next((x for x in dinsts if x.id == did), None)
            if i is not None:
                if i.state != "idle":
                    return ("busy", did)
                dinsts.remove(i)
                gone.append(i)
        new = copy.deepcopy(inst)
        same = 0
        for i in dinsts:
            if i.mask & new.mask:
                return ("overlap", i.id)
            same += i.profile == new.profile
        if same >= max_count:
            return ("count", new.profile)
        new.state, new.job, new.prio, new.ls, new.mig, new.tenant, new.created = (
            "target",
            job,
            src.prio,
            src.ls,
            False,
            src.tenant,
            True,
        )
        dinsts.append(new)
        if sg is dg:
            next(x for x in dinsts if x.id == src.id).moved = now
            dg.instances = dinsts
        else:
            src.moved = now
            dg.instances = dinsts
            self._save(sh, sg)
        self._save(sh, dg, "claim")
        j.mig_gpu, j.mig_inst = dst_gpu, new.id
        j.mig_gone = tuple(gone)
        self._state(sh, job, "running", "migrating", reason, now)
        return ("ok", new.id)

    def _t_migrate_finish(
        self, op: str, job: str, reason: str, now: float, gone: str = "destroy", node: str = "", target: str = ""
    ) -> tuple[str, str]:
        sh = self._js(job)
        j = sh.jobs.get(job)
        if j is None or j.state != "migrating":
            if op == "abort" and node and target:  # a target a release held for a stop there: the node undid it
                ns = self._ns(node)
                for gid in (g for g in (ns.nodes.get(node) or {}).get("gpus", "").split(",") if g):
                    g = ns.gpus.get(gid)
                    hits = [
                        i for i in (g.instances if g else ())
                        if i.state == "retiring" and i.job == job and len(i.id) > len(target)
                        and i.id.endswith(target)
                    ]
                    for i in hits:
                        g.instances.remove(i)  # type: ignore[union-attr]
                    if g is not None and hits:
                        self._save(ns, g)
            return ("noop", j.state if j else "")
        _, sg = self._gpu(j.gpu)
        _, dg = self._gpu(j.mig_gpu)
        assert sg is not None and dg is not None
        src = next((x for x in sg.instances if x.id == j.inst), None)
        dst = next((x for x in dg.instances if x.id == j.mig_inst), None)
        back: list[str] = []
        if op == "commit":
            if dst is not None:
                dst.state, dst.mig, dst.moved = "busy", bool(src and src.mig), now
                dst.started, dst.created = (src.started if src else now) or now, False
                dst.ends = (src.ends if src else 0.0) or dst.ends
            if src is not None and src.job == job:
                _idle(src)
            detail = f"{j.gpu}|{j.inst}"
            j.gpu, j.inst = j.mig_gpu, j.mig_inst
        else:
            if dst is not None and dst.job == job:
                dg.instances.remove(dst)
            # the idle instances the reserve removed from the target's way (migrate.lua)
            back = give_back(dg.instances, j.mig_gone, "idle" if gone == "idle" else "retiring")
            detail = f"{dg.id}|{','.join(back)}" if back and gone != "idle" else ""
        j.mig_gpu = j.mig_inst = ""
        j.mig_gone = ()
        if sg is not dg:
            self._save(sh, sg)
        self._save(sh, dg, "claim" if back else True)
        self._state(sh, job, "migrating", "running", reason, now)
        return ("ok", detail)
