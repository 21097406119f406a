"""Store benchmark on a synthetic knowledge graph (default 200k entities, 1M edges).

    python bench/store.py                                  # full size, MiniLM embedder
    python bench/store.py --entities 20000 --edges 100000 --embedder hash:256   # quick check
    python bench/store.py --store neo4j://127.0.0.1:7687   # both backends side by side, see below

With a Neo4j URI as --store, the same graph and a synthetic corpus (default 100k passages) go into an
embedded store (bench/out/backends) and into the server (namespace `bench`, dropped afterwards), and one
table compares ingest throughput, query latency (node_info, match_entities, search in each mode) and how
often both return the same top hit. Its embedder defaults to hash:384 (MiniLM's dimension, no model time);
`--scale 0.1` runs a tenth of the size. Use a scratch database: one database holds one embedder dimension.

Reports ingest time, then compares against baselines measured on the same database in the
same run:
- node_info latency vs the raw SQLite statements node_info runs. Target: node_info p50 <= 2x the raw p50.
- match_entities top-10 vs an exact search (same fusion, brute-force dense over every entity
  vector + the same FTS list). Targets: recall@10 >= 0.99, p50 <= 5 ms.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import faiss
import numpy as np

from mhqa_graph.store import NEO4J_SCHEMES, open_store
from mhqa_graph.store.base import MAX_NODE_FACTS
from mhqa_graph.store.embedded import SQL_FACTS, EmbeddedStore
from mhqa_graph.store.fusion import candidate_depth, reciprocal_rank_fusion
from mhqa_graph.types import Passage

GRAPH = "synthetic"
K = 10
NODE_INFO_RATIO_TARGET = 2.0
RECALL_TARGET = 0.99
MATCH_P50_TARGET_MS = 5.0

FIRST = ("James Mary John Patricia Robert Jennifer Michael Linda William Elizabeth David Barbara Richard Susan "
         "Joseph Jessica Thomas Sarah Charles Karen Daniel Nancy Matthew Lisa Anthony Margaret Mark Betty Donald "
         "Sandra Steven Ashley Paul Dorothy Andrew Kimberly Joshua Emily Kenneth Donna Kevin Michelle Brian Carol "
         "George Amanda Edward Melissa Ronald Deborah Timothy Stephanie Jason Rebecca Jeffrey Laura Ryan Helen "
         "Jacob Sharon Gary Cynthia Nicholas Kathleen Eric Amy Stephen Shirley Jonathan Angela Larry Anna Justin "
         "Ruth Scott Brenda Frank Pamela Brandon Nicole Raymond Katherine Gregory Virginia Samuel Catherine "
         "Benjamin Christine Patrick Samantha Jack Debra Dennis Janet Jerry Rachel Alexander Carolyn Tyler Emma "
         "Henri Giulia Hans Ingrid Pierre Sofia Luca Marta Kenji Yuki Pavel Olga Ahmed Fatima Carlos Lucia").split()
LAST = ("Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez Gonzalez Wilson "
        "Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris Sanchez Clark Ramirez Lewis "
        "Robinson Walker Young Allen King Wright Scott Torres Nguyen Hill Flores Green Adams Nelson Baker Hall "
        "Rivera Campbell Mitchell Carter Roberts Gomez Phillips Evans Turner Diaz Parker Cruz Edwards Collins "
        "Reyes Stewart Morris Morales Murphy Cook Rogers Gutierrez Ortiz Morgan Cooper Peterson Bailey Reed Kelly "
        "Howard Ramos Kim Cox Ward Richardson Watson Brooks Chavez Wood James Bennett Gray Mendoza Ruiz Hughes "
        "Price Alvarez Castillo Sanders Patel Myers Long Ross Foster Jimenez Powell Jenkins Perry Russell Sullivan "
        "Bell Coleman Butler Henderson Barnes Fisher Vasquez Simmons Romero Jordan Patterson Alexander Hamilton "
        "Graham Reynolds Griffin Wallace Moreau Dubois Rossi Bianchi Schmidt Schneider Tanaka Suzuki Ivanov "
        "Petrov Novak Kowalski Larsen Hansen Jensen Nilsson Berg Okafor Mensah Silva Santos Costa").split()
ADJ = ("Royal Northern Southern Eastern Western Great Little Old New Golden Silver Red Blue Green Black White "
       "Hidden Silent Broken Lost Last First Eternal Wild Dark Bright Lonely Secret Burning Frozen Crimson Iron "
       "Stone Crystal Electric Midnight Summer Winter Autumn Spring Ancient Modern Holy Free United Grand Upper "
       "Lower Central National Imperial Federal Coastal Highland Lowland Sacred Distant Quiet Restless").split()
NOUN = ("River Mountain Valley Harbor Forest Island Bridge Tower Garden Castle Road Sea Lake Storm Fire Heart "
        "Dream Shadow Light Night Day Moon Sun Star Sky Wind Rain Snow Crown Sword Shield Rose Lion Eagle Wolf "
        "Horse Dragon Song Dance Story Letter Promise Journey Kingdom Empire Republic Empire City Village Station "
        "Line Circle Garden Mirror Window Door Key Clock Bell Ship Train Voyage Frontier Border Coast Plain").split()
ROOT = ("Ash Elm Oak Pine Birch Maple Willow Cedar Thorn Brook Stone Wood Clay Marsh Fair Glen High Low Brad "
        "Chester Wickham Dover Hart Ross Kings Queens Bridge Mill Red Black White Green Bell Sand Salt Iron Cold "
        "Warm Long Short Far Near Swan Fox Deer Hawk Raven Crow Wolf Bear Lyn Bex Kirk Cam Dal Fen Hol Whit").split()
SUFFIX = "ford bury ton ham field wood dale worth ley stead mouth port wick by thorpe caster minster borough".split()
PLACE_PRE = "North South East West Upper Lower Great Little New Old Port Lake Mount Fort Saint Glen".split()
PLACE_POST = "County River Bay Island Valley Heights Park District Province Hills Falls Springs".split()
ORG = ("University College Institute Football Club Bank Company Records Press Airlines Railway Hospital "
       "Orchestra Theatre Museum Library Society Party Foundation Academy Observatory Brewery Motors").split()
WORK = ("film", "album", "novel", "song", "play", "TV series", "poem", "opera", "painting", "video game")
RELATIONS = ("place of birth, place of death, country, located in, capital of, member of, employer, educated at, "
             "spouse, child, father, mother, sibling, director, producer, performer, composer, author, publisher, "
             "record label, genre, founded by, headquarters, owned by, part of, award received, nominated for, "
             "occupation, citizenship, language").split(", ")


def make_names(n: int, rng: random.Random) -> list[str]:
    """`n` distinct (case-insensitively) entity names that share words, like real KG names."""
    def person() -> str:
        middle = f" {rng.choice('ABCDEFGHIJKLMNOPRSTW')}." if rng.random() < 0.5 else ""
        name = f"{rng.choice(FIRST)}{middle} {rng.choice(LAST)}"
        jobs = ("footballer", "politician", "actor", "singer", "writer", "painter", "physicist")
        return name if rng.random() < 0.8 else f"{name} ({rng.choice(jobs)})"

    def place() -> str:
        town = rng.choice(ROOT) + rng.choice(SUFFIX)
        r = rng.random()
        if r < 0.3:
            return town
        return f"{rng.choice(PLACE_PRE)} {town}" if r < 0.65 else f"{town} {rng.choice(PLACE_POST)}"

    def org() -> str:
        stem = rng.choice(ROOT) + rng.choice(SUFFIX) if rng.random() < 0.5 else f"{rng.choice(ADJ)} {rng.choice(NOUN)}"
        return f"{stem} {rng.choice(ORG)}"

    def work() -> str:
        if rng.random() < 0.5:
            title = f"The {rng.choice(ADJ)} {rng.choice(NOUN)}"
        else:
            title = f"{rng.choice(NOUN)} of {rng.choice(ROOT)}{rng.choice(SUFFIX)}"
        return f"{title} ({rng.randint(1930, 2023)} {rng.choice(WORK)})" if rng.random() < 0.7 else title

    makers = (person, person, person, place, org, work, work)
    seen: dict[str, str] = {}
    while len(seen) < n:
        name = rng.choice(makers)()
        seen.setdefault(name.casefold(), name)
    return list(seen.values())


def make_edges(names: list[str], n_edges: int, seed: int) -> list[tuple[str, str, str]]:
    """Every entity gets one outgoing edge; the rest follow a skewed (Zipf-like) degree distribution."""
    rng = np.random.default_rng(seed)
    n = len(names)
    weights = 1.0 / np.arange(1, n + 1) ** 0.7
    weights /= weights.sum()
    popular = rng.permutation(n)  # which entity gets which popularity rank
    rel_weights = 1.0 / np.arange(1, len(RELATIONS) + 1)
    rel_weights /= rel_weights.sum()
    extra = int((n_edges - n) * 1.2) + 1000
    subj = np.concatenate([rng.permutation(n), popular[rng.choice(n, extra, p=weights)]])
    obj = popular[rng.choice(n, len(subj), p=weights)]
    rel = rng.choice(len(RELATIONS), len(subj), p=rel_weights)
    seen: dict[tuple[int, int, int], None] = {}
    for s, r, o in zip(subj.tolist(), rel.tolist(), obj.tolist()):
        if s != o:
            seen.setdefault((s, r, o), None)
            if len(seen) >= n_edges:
                break
    return [(names[s], RELATIONS[r], names[o]) for s, r, o in seen]


class TimedEmbedder:
    """Wraps the store's embedder to time every call and print progress during ingest."""

    def __init__(self, inner, progress_every: int = 20_000) -> None:
        self.inner, self.spec, self.dim = inner, inner.spec, inner.dim
        self.calls: list[float] = []
        self.texts = 0
        self.progress_every = progress_every
        self._next = progress_every
        self._start = time.perf_counter()

    def embed(self, texts: list[str]) -> np.ndarray:
        t = time.perf_counter()
        out = self.inner.embed(texts)
        self.calls.append(time.perf_counter() - t)
        self.texts += len(texts)
        if self.progress_every and self.texts >= self._next:
            print(f"  embedded {self.texts} names, {time.perf_counter() - self._start:.0f} s", flush=True)
            self._next += self.progress_every
        return out


def perturb(name: str, rng: random.Random) -> str:
    """A query a user might type for `name`: a word dropped, lowercased, or a typo."""
    words = name.split()
    kind = rng.choice(("drop", "lower", "typo", "typo_lower"))
    if kind == "drop" and len(words) > 1:
        del words[rng.randrange(len(words))]
        return " ".join(words)
    if kind == "lower":
        return name.lower()
    chars = list(name)
    i = rng.randrange(len(chars))
    op = rng.choice(("swap", "delete", "insert", "replace"))
    if op == "swap" and i + 1 < len(chars):
        chars[i], chars[i + 1] = chars[i + 1], chars[i]
    elif op == "delete" and len(chars) > 3:
        del chars[i]
    elif op == "insert":
        chars.insert(i, rng.choice("abcdefghijklmnopqrstuvwxyz"))
    else:
        chars[i] = rng.choice("abcdefghijklmnopqrstuvwxyz")
    text = "".join(chars)
    return text.lower() if kind == "typo_lower" else text


def free_text(rng: random.Random) -> str:
    """A free-text query made of vocabulary words, like a question fragment."""
    templates = (
        lambda: f"the {rng.choice(ADJ).lower()} {rng.choice(NOUN).lower()} {rng.choice(WORK)}",
        lambda: f"{rng.choice(LAST)} who was born in {rng.choice(ROOT)}{rng.choice(SUFFIX)}",
        lambda: f"{rng.choice(ORG).lower()} in {rng.choice(PLACE_PRE)} {rng.choice(ROOT)}{rng.choice(SUFFIX)}",
        lambda: f"{rng.choice(FIRST)} the {rng.choice(['footballer', 'singer', 'painter', 'writer'])}",
    )
    return rng.choice(templates)()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000


def ingest(store: EmbeddedStore, triples: list[tuple[str, str, str]], batch: int) -> None:
    start = time.perf_counter()
    for i in range(0, len(triples), batch):
        store.add_triples(GRAPH, triples[i:i + batch])
        done = min(i + batch, len(triples))
        print(f"  {done}/{len(triples)} triples, {time.perf_counter() - start:.0f} s", flush=True)


def bench_node_info(store: EmbeddedStore, names: list[str], n: int, rng: random.Random) -> None:
    with store._sqlite.lend() as db:
        _bench_node_info(store, db, names, n, rng)


def _bench_node_info(store: EmbeddedStore, db, names: list[str], n: int, rng: random.Random) -> None:
    sample = rng.sample(names, min(n, len(names)))

    def raw_sql(name: str) -> list:
        return [row for sql in SQL_FACTS.values() for row in db.execute(sql, (GRAPH, name, MAX_NODE_FACTS))]

    runs = {"node_info": lambda name: store.node_info(GRAPH, name), "raw SQL": raw_sql}
    for name in sample[:100]:  # warm up caches and query plans
        for fn in runs.values():
            fn(name)
    times: dict[str, list[float]] = {label: [] for label in runs}
    labels = list(runs)
    degrees = []
    for j, name in enumerate(sample):
        for label in labels[j % len(labels):] + labels[:j % len(labels)]:  # no one always runs first
            t = time.perf_counter()
            out = runs[label](name)
            times[label].append(time.perf_counter() - t)
            if label == "node_info":
                degrees.append(len(out.facts))
    print(f"\nnode_info over {len(sample)} random entities (degree p50 {np.median(degrees):.0f}, "
          f"p90 {np.percentile(degrees, 90):.0f}, max {max(degrees)})")
    print(f"{'':16}{'p50 ms':>9}{'p90 ms':>9}")
    for label in labels:
        print(f"{label:16}{pct(times[label], 50):9.3f}{pct(times[label], 90):9.3f}")
    ratio = pct(times["node_info"], 50) / pct(times["raw SQL"], 50)
    verdict = "PASS" if ratio <= NODE_INFO_RATIO_TARGET else "FAIL"
    print(f"{verdict} node_info p50 within {NODE_INFO_RATIO_TARGET:.0f}x of raw SQL ({ratio:.2f}x)")


def exact_match(store: EmbeddedStore, ids: np.ndarray, vectors: np.ndarray, vector: np.ndarray,
                text: str, k: int) -> list[int]:
    """match_entities with brute-force dense search: same FTS list, same fusion."""
    depth = candidate_depth(k)
    scores = vectors @ vector
    top = np.argpartition(-scores, depth)[:depth]
    dense = ids[top[np.argsort(-scores[top], kind="stable")]].tolist()
    lexical = store.lexical_entities(GRAPH, text, depth)
    return [int(i) for i, _ in reciprocal_rank_fusion([dense, lexical])[:k]]


def bench_match(store: EmbeddedStore, names: list[str], n: int, rng: random.Random, timed: TimedEmbedder) -> None:
    index = store._vector_index("graph", GRAPH).index
    ids = faiss.vector_to_array(index.id_map).astype(np.int64)
    vectors = faiss.downcast_index(index.index).storage.reconstruct_n(0, index.ntotal)
    with store._sqlite.lend() as db:
        name_to_id = dict(db.execute("SELECT name, id FROM entities WHERE graph = ?", (GRAPH,)).fetchall())

    queries: dict[str, None] = {}
    while len(queries) < n:  # all distinct, so no cache could help
        q = free_text(rng) if rng.random() < 0.2 else perturb(rng.choice(names), rng)
        if q.strip():
            queries.setdefault(q, None)

    for q in list(queries)[:20]:  # warm up
        store.match_entities(GRAPH, q + " warmup", k=K)
    timed.progress_every = 0
    total, embed, recalls = [], [], []
    for q in queries:
        before = len(timed.calls)
        t = time.perf_counter()
        hits = store.match_entities(GRAPH, q, k=K)
        total.append(time.perf_counter() - t)
        embed.append(sum(timed.calls[before:]))
        ours = {name_to_id[h.name] for h in hits}
        exact = exact_match(store, ids, vectors, timed.inner.embed([q])[0], q, K)
        recalls.append(len(ours & set(exact)) / max(1, min(K, len(exact))))
    rest = [t - e for t, e in zip(total, embed)]
    recall = statistics.fmean(recalls)
    print(f"\nmatch_entities over {len(queries)} distinct queries (k={K}, candidate depth {candidate_depth(K)})")
    print(f"{'':16}{'p50 ms':>9}{'p90 ms':>9}")
    for label, values in (("total", total), ("embed query", embed), ("rest", rest)):
        print(f"{label:16}{pct(values, 50):9.3f}{pct(values, 90):9.3f}")
    print(f"recall@{K} vs exact search: {recall:.4f} (min {min(recalls):.1f}, "
          f"{sum(r < 1 for r in recalls)} queries below 1)")
    print(f"{'PASS' if recall >= RECALL_TARGET else 'FAIL'} recall@{K} >= {RECALL_TARGET} ({recall:.4f})")
    p50 = pct(total, 50)
    print(f"{'PASS' if p50 <= MATCH_P50_TARGET_MS else 'FAIL'} match_entities p50 <= {MATCH_P50_TARGET_MS:.0f} ms "
          f"({p50:.2f} ms; embedding {pct(embed, 50):.2f} ms, rest {pct(rest, 50):.2f} ms)")

# -- both backends side by side (--store neo4j://...) -------------------------------------------------
CORPUS = "synthetic-text"


def make_passages(names: list[str], triples: list[tuple[str, str, str]], n: int) -> list[Passage]:
    """`n` passages, one per entity (cycling with a part number past the last), stating up to 6 of its facts."""
    facts: dict[str, list[str]] = {}
    for s, r, o in triples:
        if len(facts.setdefault(s, [])) < 6:
            facts[s].append(f"its {r} is {o}")
    passages = []
    for i in range(n):
        name = names[i % len(names)]
        part = f" (part {i // len(names) + 1})" if i >= len(names) else ""
        said = "; ".join(facts.get(name, [])) or "nothing else is recorded about it"
        passages.append(Passage(f"s{i}", name + part, f"{name} is an entry of the synthetic knowledge graph: {said}."))
    return passages


def _wrap_embedder(store) -> TimedEmbedder:
    """Time the store's embedder (both backends keep it in `_embedder`; `embedded.embedder` is read-only)."""
    timed = TimedEmbedder(store._embedder, progress_every=0)
    store._embedder = timed
    return timed


def _timed(fn, items: list, batch: int, label: str, backend: str) -> float:
    start = time.perf_counter()
    for i in range(0, len(items), batch):
        fn(items[i:i + batch])
        print(f"  {backend}: {min(i + batch, len(items))}/{len(items)} {label}, {time.perf_counter() - start:.0f} s",
              flush=True)
    return time.perf_counter() - start


def _latency(fn, queries: list) -> tuple[list, list[float]]:
    for q in queries[:20]:  # warm up caches and query plans
        fn(q)
    out, times = [], []
    for q in queries:
        t = time.perf_counter()
        out.append(fn(q))
        times.append(time.perf_counter() - t)
    return out, times


def _measure(backend: str, store, rows: dict, args: argparse.Namespace, names: list[str], triples: list,
             passages: list[Passage], queries: tuple[list[str], list[str], list[str]]) -> dict[str, list]:
    """Ingest into `store`, time the queries; adds its column to `rows`, returns the answers by row label."""
    node_sample, entity_queries, text_queries = queries
    timed = _wrap_embedder(store)
    took = _timed(lambda b: store.add_triples(GRAPH, b), triples, args.batch, "triples", backend)
    embed_s, timed.calls = sum(timed.calls), []
    rows.setdefault(f"ingest {len(triples):,} edges ({len(names):,} entities)", {})[backend] = (
        f"{took:.0f} s, {len(triples) / took:,.0f} edges/s ({embed_s:.0f} s embedding)")
    took = _timed(lambda b: store.add_passages(CORPUS, b), passages, args.passage_batch, "passages", backend)
    embed_s = sum(timed.calls)
    rows.setdefault(f"ingest {len(passages):,} passages", {})[backend] = (
        f"{took:.0f} s, {len(passages) / took:,.0f} passages/s ({embed_s:.0f} s embedding)")
    stats = store.stats()
    assert stats.graphs[GRAPH]["triples"] == len(triples), stats
    assert stats.corpora[CORPUS]["passages"] == len(passages), stats
    measured = {
        f"node_info ({len(node_sample)} entities)": _latency(lambda n: store.node_info(GRAPH, n), node_sample),
        f"match_entities k={K} ({len(entity_queries)} queries)": _latency(
            lambda q: store.match_entities(GRAPH, q, k=K), entity_queries)}
    for mode in ("bm25", "dense", "hybrid"):
        measured[f"search {mode} k={K} ({len(text_queries)} queries)"] = _latency(
            lambda q, m=mode: store.search(CORPUS, q, k=K, mode=m), text_queries)
    for label, (_, times) in measured.items():
        rows.setdefault(f"{label}: p50 / p90 ms", {})[backend] = f"{pct(times, 50):.2f} / {pct(times, 90):.2f}"
    return {label: out for label, (out, _) in measured.items()}


def compare_backends(args: argparse.Namespace) -> int:
    scale = args.scale
    rng = random.Random(args.seed)
    t = time.perf_counter()
    names = make_names(int(args.entities * scale), rng)
    triples = make_edges(names, int(args.edges * scale), args.seed)
    passages = make_passages(names, triples, int(args.passages * scale))
    print(f"synthetic data: {len(names)} entities, {len(triples)} edges, {len(passages)} passages "
          f"({time.perf_counter() - t:.1f} s to generate); embedder {args.embedder}")

    root = Path(args.embedded_dir)
    if root.exists():
        if any(root.iterdir()) and not (root / "store.sqlite").exists():
            sys.exit(f"{root} exists and is not a store; refusing to delete it")
        shutil.rmtree(root)
    embedded = open_store(f"embedded://{root.resolve()}", embedder=args.embedder)
    neo4j = open_store(args.store, embedder=args.embedder)
    neo4j.namespace = args.namespace
    neo4j.drop_namespace()  # a namespace an interrupted run left
    stores = {"embedded": embedded, "neo4j": neo4j}
    rows: dict[str, dict[str, str]] = {}
    results: dict[str, dict[str, list]] = {}
    qrng = random.Random(args.seed + 1)
    node_sample = qrng.sample(names, min(args.node_queries, len(names)))
    entity_queries = [free_text(qrng) if qrng.random() < 0.2 else perturb(qrng.choice(names), qrng)
                      for _ in range(args.match_queries)]
    text_queries = [free_text(qrng) if qrng.random() < 0.5 else perturb(qrng.choice(names), qrng)
                    for _ in range(args.search_queries)]
    try:
        for backend, store in stores.items():
            results[backend] = _measure(backend, store, rows, args, names, triples, passages,
                                        (node_sample, entity_queries, text_queries))
            print(f"  {backend}: done", flush=True)
    finally:
        if not args.keep:
            neo4j.drop_namespace()
        neo4j.close()
        embedded.close()

    print(f"\n| {len(names):,} entities, {len(triples):,} edges, {len(passages):,} passages | embedded | neo4j |")
    print("|---|---|---|")
    for label, by_backend in rows.items():
        print(f"| {label} | {by_backend.get('embedded', '')} | {by_backend.get('neo4j', '')} |")
    print("\nsame answers (embedded vs neo4j):")
    for label, ours in results["embedded"].items():
        theirs = results["neo4j"][label]
        if label.startswith("node_info"):
            same = sum(a == b for a, b in zip(ours, theirs))
            print(f"- {label}: the same facts for {same} of {len(ours)}")
        else:
            def key(hit):
                return getattr(hit, "name", None) or hit.id
            top1 = sum([key(h) for h in a[:1]] == [key(h) for h in b[:1]] for a, b in zip(ours, theirs))
            overlap = statistics.fmean(len({key(h) for h in a} & {key(h) for h in b}) / max(1, len(a))
                                       for a, b in zip(ours, theirs))
            print(f"- {label}: the same top hit for {top1} of {len(ours)}; top-{K} overlap {overlap:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=200_000)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--embedder", default="all-minilm-l6-v2", help="e.g. all-minilm-l6-v2 or hash:256")
    parser.add_argument("--store", default="bench/out/kg_store",
                        help="store directory (replaced unless --reuse), or a Neo4j URI to compare both backends")
    parser.add_argument("--reuse", action="store_true", help="keep an existing store of the same size, skip ingest")
    parser.add_argument("--batch", type=int, default=50_000, help="triples per add_triples call")
    parser.add_argument("--node-queries", type=int, default=2000)
    parser.add_argument("--match-queries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads (1 is faster on a busy machine)")
    both = parser.add_argument_group("with a Neo4j URI as --store")
    both.add_argument("--passages", type=int, default=100_000)
    both.add_argument("--scale", type=float, default=1.0, help="multiplies --entities, --edges and --passages")
    both.add_argument("--search-queries", type=int, default=300, help="per search mode")
    both.add_argument("--passage-batch", type=int, default=10_000, help="passages per add_passages call")
    both.add_argument("--embedded-dir", default="bench/out/backends", help="the embedded store (replaced)")
    both.add_argument("--namespace", default="bench", help="the Neo4j namespace (dropped before and after)")
    both.add_argument("--keep", action="store_true", help="keep the Neo4j namespace afterwards")
    args = parser.parse_args()
    if args.store.split(":", 1)[0] in NEO4J_SCHEMES:
        if "--embedder" not in sys.argv:
            args.embedder = "hash:384"
        if "--node-queries" not in sys.argv:
            args.node_queries = 1000
        if args.torch_threads:
            import torch

            torch.set_num_threads(args.torch_threads)
        return compare_backends(args)
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)

    rng = random.Random(args.seed)
    t = time.perf_counter()
    names = make_names(args.entities, rng)
    triples = make_edges(names, args.edges, args.seed)
    print(f"synthetic KG: {len(names)} entities, {len(triples)} edges, {len(RELATIONS)} relations "
          f"({time.perf_counter() - t:.1f} s to generate)")

    root = Path(args.store)
    if root.exists() and not args.reuse:
        if any(root.iterdir()) and not (root / "store.sqlite").exists():
            sys.exit(f"{root} exists and is not a store; refusing to delete it")
        shutil.rmtree(root)
    store = open_store(f"embedded://{root.resolve()}", embedder=args.embedder)
    assert isinstance(store, EmbeddedStore)
    timed = TimedEmbedder(store.embedder)
    store._embedder = timed  # `embedder` is a read-only property
    print(f"store {root}, embedder {timed.spec}")

    stats = store.stats().graphs.get(GRAPH, {})
    if args.reuse and stats.get("triples") == len(triples):
        print("reusing the existing store (no ingest)")
    else:
        t = time.perf_counter()
        ingest(store, triples, args.batch)
        elapsed = time.perf_counter() - t
        embed_s = sum(timed.calls)
        print(f"ingest: {elapsed:.1f} s total ({len(triples) / elapsed:.0f} edges/s), of which embedding "
              f"{timed.texts} names {embed_s:.1f} s, SQLite+HNSW {elapsed - embed_s:.1f} s")
    stats = store.stats().graphs[GRAPH]
    print(f"store holds {stats['entities']} entities, {stats['triples']} triples")

    bench_node_info(store, names, args.node_queries, rng)
    bench_match(store, names, args.match_queries, rng, timed)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
