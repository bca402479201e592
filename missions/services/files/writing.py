"""Writing a mission file's rows: what the mission holds before the import (`Existing`),
the writer that saves only what differs (`Writer`), and one `write_*` function for each
section of the file, each matched by key; `importing._apply` calls them in the file's
order (the mission, its milestones, their assertions, their slices and features)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, models, transaction
from django.utils import timezone

from missions.models import ContractAssertion, FeatureAssertion, Milestone, Mission, MissionFeature, Slice
from missions.services.files.validating import Document, Node


class MissionRace(Exception):
    """The mission insert lost a race with a concurrent import of the same key."""


@dataclass
class Existing:
    """The mission's rows before the import, by key, and its dependency and link pairs."""

    milestones: dict[str, Milestone] = field(default_factory=dict)
    assertions: dict[str, ContractAssertion] = field(default_factory=dict)
    slices: dict[str, Slice] = field(default_factory=dict)
    features: dict[str, MissionFeature] = field(default_factory=dict)
    dependencies: set[tuple[int, int]] = field(default_factory=set)
    links: set[tuple[int, int]] = field(default_factory=set)

    def parents(self) -> tuple[dict[int, int], dict[str, int], dict[str, int]]:
        """Where each stored slice (by id), feature and assertion (by key) is before the
        file is written (the writes change these rows in place): their milestone, their
        slice, their milestone."""
        return (
            {s.pk: s.milestone_id for s in self.slices.values()},
            {k: f.slice_id for k, f in self.features.items()},
            {k: a.milestone_id for k, a in self.assertions.items()},
        )

    @classmethod
    def load(cls, mission: Mission | None) -> Existing:
        if mission is None:
            return cls()
        return cls(
            milestones={m.key: m for m in Milestone.objects.filter(mission=mission)},
            assertions={a.key: a for a in ContractAssertion.objects.filter(mission=mission)},
            slices={s.key: s for s in Slice.objects.filter(mission=mission)},
            features={f.key: f for f in MissionFeature.objects.filter(mission=mission)},
            dependencies=set(
                Milestone.dependencies.through.objects.filter(from_milestone__mission=mission).values_list(
                    "from_milestone_id", "to_milestone_id"
                )
            ),
            links=set(
                FeatureAssertion.objects.filter(feature__mission=mission).values_list("feature_id", "assertion_id")
            ),
        )


class Writer:
    """Saves only what differs, so an unchanged file leaves every `updated_at` alone."""

    def __init__(self) -> None:
        self.changed = False
        self.saved: set[tuple[type, int]] = set()
        self.created: set[tuple[type, int]] = set()
        # Milestones whose assertions or links this import changed (docs/TRUTH.md: they
        # are not complete any more, and passed features they judge are judged again).
        self.contract_changed: set[int] = set()

    def upsert(self, model: type[models.Model], current: models.Model | None, values: dict[str, Any]) -> Any:
        if current is None:
            obj = model(**values)
            obj.save()
            self._mark(obj)
            self.created.add((model, obj.pk))
            return obj
        dirty = [name for name, value in values.items() if getattr(current, name) != value]
        if dirty:
            for name in dirty:
                setattr(current, name, values[name])
            current.save(update_fields=[*dirty, "updated_at"])
            self._mark(current)
        return current

    def touch(self, obj: models.Model) -> None:
        """A many-to-many change is a write of its owner: bump `updated_at` once."""
        if (type(obj), obj.pk) not in self.saved:
            type(obj)._default_manager.filter(pk=obj.pk).update(updated_at=timezone.now())
            self._mark(obj)

    def _mark(self, obj: models.Model) -> None:
        self.changed = True
        self.saved.add((type(obj), obj.pk))


def _orders(nodes: list[Node], current: dict[str, Any], parent_attr: str, parent_id: int | None) -> list[int]:
    """List positions, unless the stored rows already sort (order, id) the way the file lists them."""
    objs = [o for n in nodes if (o := current.get(n.key)) is not None and getattr(o, parent_attr) == parent_id]
    stored = [o.pk for o in sorted(objs, key=lambda o: (o.order, o.pk))]
    if parent_id is not None and len(objs) == len(nodes) and stored == [o.pk for o in objs]:
        return [o.order for o in objs]
    return list(range(len(nodes)))


def write_mission(node: Node, mission: Mission | None, user, owner, writer: Writer) -> Mission:
    values = dict(node.values)
    if owner is not None:
        values["owner_id"] = owner.pk
    if mission is not None:
        values.pop("status")  # states change through services, not files
        return writer.upsert(Mission, mission, values)
    if owner is None and user is not None and getattr(user, "is_authenticated", False):
        values["owner_id"] = user.pk
    try:
        with transaction.atomic():
            return writer.upsert(Mission, None, values)
    except IntegrityError as exc:
        if Mission.objects.filter(key=values["key"]).exists():
            raise MissionRace from exc
        raise


def write_milestones(doc: Document, mission: Mission, existing: Existing, writer: Writer) -> dict[str, Milestone]:
    orders = _orders(doc.milestones, existing.milestones, "mission_id", mission.pk)
    saved = {}
    for node, order in zip(doc.milestones, orders, strict=True):
        values = {**node.values, "mission_id": mission.pk, "order": order}
        saved[node.key] = writer.upsert(Milestone, existing.milestones.get(node.key), values)
    through = Milestone.dependencies.through
    for node in doc.milestones:
        ms = saved[node.key]
        wanted = {saved[k].pk for k in node.refs}
        have = {to for frm, to in existing.dependencies if frm == ms.pk}
        if wanted != have:
            through.objects.filter(from_milestone_id=ms.pk, to_milestone_id__in=have - wanted).delete()
            through.objects.bulk_create(
                [through(from_milestone_id=ms.pk, to_milestone_id=to) for to in sorted(wanted - have)]
            )
            writer.touch(ms)
    return saved


def write_assertions(
    doc: Document, milestones: dict[str, Milestone], existing: Existing, writer: Writer
) -> dict[str, ContractAssertion]:
    saved = {}
    for m in doc.milestones:
        parent = milestones[m.key]
        orders = _orders(m.assertions, existing.assertions, "milestone_id", parent.pk)
        for node, order in zip(m.assertions, orders, strict=True):
            values = {**node.values, "milestone_id": parent.pk, "order": order}
            saved[node.key] = writer.upsert(ContractAssertion, existing.assertions.get(node.key), values)
    return saved


def write_slices_and_features(
    doc: Document,
    milestones: dict[str, Milestone],
    assertions: dict[str, ContractAssertion],
    existing: Existing,
    writer: Writer,
) -> tuple[dict[str, Slice], dict[str, MissionFeature]]:
    slices: dict[str, Slice] = {}
    features: dict[str, MissionFeature] = {}
    for m in doc.milestones:
        parent = milestones[m.key]
        slice_orders = _orders(m.slices, existing.slices, "milestone_id", parent.pk)
        for s_node, s_order in zip(m.slices, slice_orders, strict=True):
            values = {**s_node.values, "milestone_id": parent.pk, "order": s_order}
            slice_ = slices[s_node.key] = writer.upsert(Slice, existing.slices.get(s_node.key), values)
            orders = _orders(s_node.features, existing.features, "slice_id", slice_.pk)
            for f_node, f_order in zip(s_node.features, orders, strict=True):
                values = {**f_node.values, "slice_id": slice_.pk, "order": f_order}
                feature = writer.upsert(MissionFeature, existing.features.get(f_node.key), values)
                features[f_node.key] = feature
                _write_links(feature, {assertions[k].pk for k in f_node.refs}, existing, writer)
    return slices, features


def _write_links(feature: MissionFeature, wanted: set[int], existing: Existing, writer: Writer) -> None:
    have = {aid for fid, aid in existing.links if fid == feature.pk}
    if wanted == have:
        return
    FeatureAssertion.objects.filter(feature_id=feature.pk, assertion_id__in=have - wanted).delete()
    for assertion_id in sorted(wanted - have):
        FeatureAssertion.objects.create(feature_id=feature.pk, assertion_id=assertion_id)
    writer.touch(feature)
    writer.contract_changed |= set(
        ContractAssertion.objects.filter(pk__in=have ^ wanted).values_list("milestone_id", flat=True)
    ) | {feature.slice.milestone_id}
