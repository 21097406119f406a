"""`auto`: answer cheaply first, escalate to a multi-hop design only when the cheap answer is not supported.

    START -> start -> rag -> judge --stop-----------------------------------------------------> END
                                  \\-look again-> second_look --stop---------------------------> END
                                  \\-escalate--------------------\\-escalate-> opera | mujica | omne
                                                                                  -> reconcile -> END

Each stage is a node that runs its agent's compiled graph as a subgraph: LangGraph's xray, Studio and
`stream(subgraphs=True)` show the designs' own nodes.

- **rag**: one retrieval, one constrained answer. The **judge** decides from the evidence, without a model call
  (`judge.supported`). It stops when the answer is supported: found in a shown passage or fact and, on a graph, one
  the question names (one of its options, or yes/no). On a graph, `rag` shows the facts of the entities the
  question names, so an entity it answers with is one or two facts from them, where a multi-hop answer is usually
  the bridge, not the end of the chain ("which nationality is X's husband?" answered with the husband): finding the
  end is the walk's work. An empty answer, a refusal, an answer no evidence holds, or a graph entity the question
  does not name escalates; with `form_check`, so does an answer not of the form the question asks for (neither of
  its two options, or not yes/no to a yes-no question). A supported answer the model gave a low probability (below
  `min_confidence`, 0.5) escalates too (FLARE's signal: the probability of the answer's least likely token, from
  the backend's token log-probabilities); with `trust_confidence`, a graph answer the question does not name stops
  when the model is at least that sure of it.
- **second_look** (`second_look`, on a corpus): a supported answer is looked at again before it stops: `rag`
  searches for the question with that answer added (the next hop's passages, when the answer is a bridge) and
  answers again; the two answers agreeing stops, differing escalates.
- **opera | mujica | omne**: the design that suits the store: Omne over a graph, OPERA over a corpus
  (`escalate_to`). With `hand_over`, Omne starts from what the first stage found: the facts of the entities rag
  matched that the question names are its first tool results, so its turns could go to the hops beyond them (off
  by default: the 1.5B model calls node_info on those entities again and loops on the repeat; docs/benchmarks.md).
- **reconcile** keeps the design's answer when it has one, else the first answer (a design that failed, raised or
  ran out of budget falls back to it). Two answers that agree are marked so.

The `budget` is one model-call limit: `calls` in the state counts every call made, and each stage may make what
the budget leaves after the fewest calls the stages after it need (`state.calls_left`). `stage_settings` gives a
stage settings of its own (`{"omne": {"max_rounds": 5}}`).

Every step appends to `decisions` ({stage, action, code, reason, answer; rag's confidence when it reports one}):
`code` is one of `state.Reason`, `reason` its sentence. `answered_by` names the stage whose answer stands. Both are
in the output, the trace (`design`) and the eval records, and `mhqa report` counts them.
With both a corpus and a graph, the first stage reads the corpus (as `rag` does) and the escalation is Omne.
"""

from .graph import build
from .judge import same_answer, starting_entities, supported
from .limit import BudgetExhausted
from .spec import SPEC
from .state import DESIGNS, MIN_CALLS, REASONS, AutoContext, Decision, Reason, design_for, reason_code

__all__ = ["DESIGNS", "MIN_CALLS", "REASONS", "SPEC", "AutoContext", "BudgetExhausted", "Decision", "Reason", "build",
           "design_for", "reason_code", "same_answer", "starting_entities", "supported"]
