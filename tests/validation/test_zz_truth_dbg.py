import dramatiq, pytest
from tests.validation import test_truth_property as T
from tests.validation import truth_model as model
from missions.models import *
from validation.models import *

pytestmark = pytest.mark.django_db(transaction=True)

class Data:
    def __init__(self, *values): self.values = list(values)
    def draw(self, s, label=None):
        return self.values.pop(0)

def invariants(m):
    for name in ("passed_means_true", "complete_means_done", "one_running_run", "failure_has_fix", "budgets", "runs_are_frozen"):
        try:
            getattr(m, name)()
        except AssertionError as e:
            print("VIOLATION", e)

def pending(m):
    return [m._describe(x) for x in m.pending]

def test_dbg(monkeypatch, tmp_path):
    monkeypatch.setattr(dramatiq.Actor, "send_with_options", T._record)
    monkeypatch.setattr(dramatiq.Actor, "send", T._record_send)
    T.TruthMachine.template = model.Template(tmp_path / "t")
    m = T.TruthMachine()
    T.TruthMachine.setup(m, autopilot=False, budget=1, active=True, variants=['file']*9, spare=False, per_slice=(1, 1), milestone_check=None, auto_fix=False, per_feature=[1, 1, 1, 1])
    m.create_task(Data("f1"))
    m.complete(Data("f1"), "correct", "sha")
    m.create_task(Data("f1"))
    m.complete(Data("f1", {"a1"}), "wrong", "sha")
    print(pending(m))
    m.deliver(Data(0)); m.deliver(Data(0)); print(pending(m)); m.deliver(Data(0))
    f = Feature.objects.get(mission=m.mission, key="f1"); print(f.loop_state)
    invariants(m)
    m.teardown()
