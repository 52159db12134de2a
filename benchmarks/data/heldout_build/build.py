import json, sys, collections
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import llmfoundry, mbridge
OUT = __import__("pathlib").Path(__file__).resolve().parents[1] / "published_runs_heldout.json"
FAMILIES = []
def add(rows, family_of):
    for r in rows:
        r["family"] = family_of(r)
        FAMILIES.append(r)
add(llmfoundry.rows(), lambda r: "llm-foundry " + ("A100 80GB" if "80GB" in r["source"] else "A100 40GB"))
add(mbridge.rows(), lambda r: "Megatron-Bridge " + r["cluster"].rsplit("x", 1)[0].upper())
import nemo, torchao, bloom, mlperf, mlperf5, mbridge_moe, mbridge_cards
add(nemo.rows(), nemo.family)
add(torchao.rows(), torchao.family)
add(bloom.rows(), bloom.family)
add(mlperf.rows(), mlperf.family)
add(mlperf5.rows(), mlperf5.family)
add(mbridge_moe.rows(), mbridge_moe.family)
add(mbridge_cards.rows(), mbridge_cards.family)
ABOUT = (
    "Published training runs from sources none of published_runs.json, published_runs_2.json and "
    "published_runs_moe.json (nor ../shared/validation) holds, for scoring held out of every fit (issue 22 item 5). "
    "Same row schema as published_runs_2.json: `fixed` holds what the source printed (absent = not printed: the "
    "planner chooses), `published` the raw figures as printed, `derivation` how step_time_s follows from them, "
    "`uncertain` what was read from a default or is not known. Added to every row: `url` (or repo + path + commit) "
    "where the figures were read, `quote` (the exact table row), `quote_context` (the table's heading and header), "
    "`family` (the source family for leave-one-source-out), `model_source` (where the model config comes from). "
    "No figure is estimated: each is in the quoted text or the cited config.")
doc = {"about": ABOUT, "runs": FAMILIES}
json.dump(doc, open(OUT, "w"), indent=1)
open(OUT, "a").write("\n")
print(len(FAMILIES), collections.Counter((r["family"], r["engine"]) for r in FAMILIES))
