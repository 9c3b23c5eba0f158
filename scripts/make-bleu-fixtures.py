#!/usr/bin/env python3
"""Generate the sacreBLEU reference fixtures for Ember's Rust BLEU/chrF port.

Regenerate (from the repository root) with:

    pip install sacrebleu==2.6.0      # the version the fixtures were made with
    python3 scripts/make-bleu-fixtures.py

Writes into ``crates/sacrebleu/tests/fixtures/``:

* ``<corpus>.hyp.txt`` and ``<corpus>.ref<k>.txt`` -- one segment per line,
  ``\\n``-terminated, UTF-8.  Segments never contain ``\\n`` or ``\\r``; other
  odd whitespace (tabs, NBSP, U+001C..U+001F, ...) is kept verbatim, so a
  reader must split on ``\\n`` only.
* ``expected.json`` -- the sacreBLEU version, one entry per scoring case
  (metric, corpus, number of references, options, and what sacreBLEU's Python
  API returns: score, n-gram counts/totals, lengths, BP, signature and the
  formatted score line), per-segment sentence scores, and a tokenisation table
  (input -> tokens for 13a / intl / none, and lowercased 13a).  Scores are
  also stored as ``repr()`` strings: JSON number parsers need not round-trip
  the last bit, and the Rust port is meant to be bit-identical.

Scores are computed from the in-memory segment lists with sacreBLEU's Python
API (``sacrebleu.metrics.BLEU`` / ``CHRF``), exactly as ``sacrebleu`` the CLI
would score the files.  Everything is deterministic: the corruptions that turn
Multi30k references into "hypotheses" use ``random.Random(SEED)``.

The Multi30k lines (``/work/shared/data/multi30k`` or ``$MULTI30K_DIR``) are
the first 80 of ``val.de.gz`` and the first 20 of ``test_2016_flickr.de.gz``;
with a hypothesis and two reference streams that is 300 committed lines.
"""

import gzip
import json
import os
import random
from pathlib import Path

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.utils import sum_of_lists

SEED = 20240611
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "sacrebleu" / "tests" / "fixtures"
MULTI30K = Path(os.environ.get("MULTI30K_DIR", "/work/shared/data/multi30k"))

# ---------------------------------------------------------------------------
# Corpora.  Each is (hypotheses, [reference stream 0, stream 1, ...]).
# ---------------------------------------------------------------------------

# Hand-written German/English/French lines: (hyp, ref0, ref1, ref2).
# They exercise unicode quotes, dashes, ellipses, number separators, hyphens,
# URLs, e-mail addresses, apostrophes and empty lines on either side.
HANDWRITTEN = [
    ("„Das ist ein Test“, sagte sie — und lachte.",
     "„Das ist ein Test“, sagte sie – und lächelte.",
     "„Das ist nur ein Test“, sagte sie und lächelte.",
     "\"Das ist ein Test\", sagte sie lächelnd."),
    ("Der Preis liegt bei 1.000,50 EUR inkl. MwSt.",
     "Der Preis beträgt 1.000,50 Euro (inkl. MwSt.).",
     "Der Preis liegt bei 1.000,50 Euro inklusive MwSt.",
     "Es kostet 1.000,50 € inkl. MwSt."),
    ("The price is $1,000.50, not 1,000,000!",
     "The price is $1,000.50, not $1,000,000!",
     "It costs $1,000.50 and not 1,000,000!",
     "The price is 1,000.50 dollars, not a million!"),
    ("« Bonjour », dit-il… puis il est parti.",
     "« Bonjour », dit-il… puis il partit.",
     "« Bonjour » dit-il, puis il s'en alla…",
     "« Salut », a-t-il dit… puis il est parti."),
    ("Das Spiel endete 3-4 nach der Verlängerung.",
     "Das Spiel endete 3-4 nach Verlängerung.",
     "Das Spiel ging 3 - 4 nach Verlängerung aus.",
     "Nach der Verlängerung stand es 3-4."),
    ("Visit https://example.com/path?q=1&lang=de for details.",
     "See https://example.com/path?q=1&lang=de for details.",
     "Details at https://example.com/path?q=1&lang=de.",
     "Visit https://example.com/path?q=1&lang=de for more details."),
    ("It's the users' choice, isn't it?",
     "It's the user's choice, isn't it?",
     "It is the user's choice, is it not?",
     "That's the user's decision, isn't it?"),
    ("Er wohnt in der Baden-Württemberg-Straße 12a.",
     "Er wohnt in der Baden-Württemberg-Straße 12a.",
     "Seine Adresse ist Baden-Württemberg-Straße 12a.",
     "Er lebt in der Baden-Württemberg-Str. 12a."),
    ("",
     "Dieser Satz wurde nicht übersetzt.",
     "Dieser Satz fehlt in der Übersetzung.",
     "Der Satz wurde nicht übersetzt."),
    ("Die Übersetzung hat hier eine Zeile zu viel.",
     "",
     "Hier steht nichts.",
     ""),
    ("", "", "", ""),
    ("Die Temperatur sank auf −5 °C (23 °F).",
     "Die Temperatur fiel auf −5 °C (23 °F).",
     "Die Temperatur sank auf minus 5 Grad Celsius.",
     "Es wurde −5 °C kalt (23 °F)."),
    ("E-Mail: max.mustermann@example.org; Tel.: +49 (0)30 123-456",
     "E-Mail: max.mustermann@example.org; Tel.: +49 (0)30 123-456",
     "Mail: max.mustermann@example.org, Telefon +49 30 123456",
     "E-Mail max.mustermann@example.org / Tel. +49 (0)30 123-456"),
    ("Wait... what?! \"Really?\" he asked.",
     "Wait... what?! \"Really?\" he asked.",
     "Wait… what?! “Really?” he asked.",
     "Hold on, what? \"Seriously?\" he asked."),
    ("Zahlen wie 3.14, 2,718 und 1e-10 sind häufig.",
     "Zahlen wie 3.14, 2,718 und 1e-10 kommen häufig vor.",
     "Werte wie 3,14, 2,718 und 1e-10 sind häufig.",
     "Zahlen wie 3.14 oder 2.718 und 1e-10 sind verbreitet."),
    ("Das kostet 12,– € bzw. 9.99 $.",
     "Das kostet 12,– € bzw. 9.99 $.",
     "Das kostet 12 Euro oder 9,99 Dollar.",
     "Preis: 12,– € bzw. 9.99 $."),
    ("Sie sagte: ‚Ich komme um 17:30 Uhr.‘",
     "Sie sagte: ‚Ich komme um 17:30 Uhr.‘",
     "Sie sagte, sie komme um 17:30 Uhr.",
     "Sie sagte: „Ich bin um 17.30 Uhr da.“"),
    ("The 2019–2020 season was canceled in mid-March.",
     "The 2019–2020 season was cancelled in mid-March.",
     "The 2019-2020 season was called off in mid-March.",
     "In mid-March, the 2019–2020 season was cancelled."),
    ("Der ICE 1234 von München Hbf nach Berlin fällt heute aus.",
     "Der ICE 1234 von München Hbf nach Berlin fällt heute aus.",
     "Heute fällt der ICE 1234 von München Hbf nach Berlin aus.",
     "Der ICE 1234 München Hbf – Berlin entfällt heute."),
    ("“Smart quotes” and ‘single ones’ — plus an ellipsis…",
     "“Smart quotes” and ‘single ones’ – plus an ellipsis…",
     "\"Smart quotes\" and 'single ones' - plus an ellipsis...",
     "“Curly quotes” and ‘single quotes’ — and an ellipsis…"),
    ("Tabs\tand  double  spaces should not matter.",
     "Tabs and double spaces should not matter.",
     "Tabs  and\tdouble spaces must not matter.",
     "Tabs and double spaces do not matter."),
    ("Ein Mann, der auf einer Bank sitzt, liest die Zeitung.",
     "Ein Mann, der auf einer Bank sitzt, liest eine Zeitung.",
     "Ein auf einer Bank sitzender Mann liest Zeitung.",
     "Ein Mann sitzt auf einer Bank und liest eine Zeitung."),
    ("A woman in a red coat walks her dog in the park.",
     "A woman in a red coat walks her dog through the park.",
     "A woman wearing a red coat is walking her dog in the park.",
     "In the park, a woman in a red coat walks her dog."),
    ("Zwei Kinder spielen am Strand im Sand.",
     "Zwei Kinder spielen im Sand am Strand.",
     "Zwei Kinder spielen am Strand im Sand.",
     "Am Strand spielen zwei Kinder im Sand."),
    ("Der Hund rennt über die grüne Wiese.",
     "Ein Hund rennt über eine grüne Wiese.",
     "Der Hund läuft über die grüne Wiese.",
     "Ein Hund rennt über das grüne Gras."),
    ("Several men are loading cotton on to a truck.",
     "A group of men is loading cotton onto a truck.",
     "Several men load cotton onto a truck.",
     "Men are loading cotton onto a lorry."),
    ("Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
     "Ein Junge mit Kopfhörern sitzt auf den Schultern einer Frau.",
     "Ein Junge mit Kopfhörern sitzt einer Frau auf den Schultern.",
     "Ein Kind mit Kopfhörern sitzt auf den Schultern einer Frau."),
    ("Das Meeting ist am 03.04.2024 um 9 Uhr (MEZ).",
     "Das Meeting findet am 03.04.2024 um 9 Uhr (MEZ) statt.",
     "Das Treffen ist am 3. April 2024 um 9 Uhr MEZ.",
     "Meeting: 03.04.2024, 9:00 Uhr (MEZ)."),
    ("Bitte lesen Sie Abschnitt 4.2.1 – „Installation“ – sorgfältig!",
     "Bitte lesen Sie Abschnitt 4.2.1 („Installation“) sorgfältig.",
     "Lesen Sie bitte Abschnitt 4.2.1, „Installation“, genau durch!",
     "Bitte Abschnitt 4.2.1 – „Installation“ – sorgfältig lesen!"),
    ("Our well-known state-of-the-art model is 50% faster (n=1,024).",
     "Our well-known state-of-the-art model is 50% faster (n = 1,024).",
     "The well-known, state-of-the-art model runs 50 % faster (n=1,024).",
     "Our widely known state-of-the-art model is 50% quicker (n=1,024)."),
]

# Chinese, Japanese, Korean and mixed-script lines (interesting for `intl`,
# which splits on Unicode punctuation/symbol categories, unlike 13a).
CJK = [
    ("我们今天去北京。", "我们今天去北京了。", "今天我们去北京。"),
    ("这个价格是1,000元，对吗？", "这个价格是1,000元，对吧？", "价格是一千元，对吗？"),
    ("「こんにちは」と彼は言った。", "「こんにちは」と彼が言った。", "彼は「こんにちは」と言った。"),
    ("東京タワーは３３３メートルです！", "東京タワーの高さは３３３メートルです！", "東京タワーは333メートルです。"),
    ("한국어 문장입니다. 맞나요?", "한국어 문장입니다. 맞습니까?", "이것은 한국어 문장입니다?"),
    ("GPU 的价格：€1.299,00（含税）", "GPU 的价格：€1.299,00（含税）。", "GPU 价格为 1299 欧元（含税）"),
    ("《三体》是刘慈欣写的科幻小说……", "《三体》是刘慈欣的科幻小说……", "科幻小说《三体》由刘慈欣创作。"),
    ("", "空行也要计算。", "空行也算。"),
    ("Mixed 中文 and English, 好吗?", "Mixed 中文 and English, 好不好?", "中文和 English 混合，好吗？"),
    ("価格は¥1,500（税込）です。", "価格は¥1,500（税込）です。", "値段は1500円（税込）です。"),
]

# Whitespace, entity, case-folding and symbol corner cases: (hyp, ref).
EDGE = [
    ("Tab\tseparated\u00a0NBSP and\u3000ideographic\u2009thin space",
     "Tab separated NBSP and ideographic thin space"),
    ("File\x1cseparators\x1dare\x1ewhitespace\x1fin Python",
     "File separators are whitespace in Python"),
    ("AT&amp;T &quot;quoted&quot; &lt;tag&gt; &amp;lt; done",
     "AT&T \"quoted\" <tag> &lt; done"),
    ("before <skipped> after", "before after"),
    ("STRASSE Straße ΣΑΣ ΟΔΟΣ İstanbul ǅ", "strasse straße σας οδος i̇stanbul ǆ"),
    ("Emoji 😀 and symbols © ® ™ ± × ÷ → ∞ €5",
     "Emoji 😀 and symbols ©®™ ±×÷ →∞ € 5"),
    ("Arabic digits ٣,٤ and ٣.٥ and superscript x² = 4.",
     "Arabic digits ٣,٤ and ٣.٥ and superscript x²=4."),
    ("trailing whitespace   \u2003\t", "trailing whitespace"),
    ("1.000.000,00 vs 1,000,000.00 vs 1 000 000",
     "1.000.000,00 versus 1,000,000.00 versus 1 000 000"),
    ("Don't split U.S.A. or e.g., i.e. in mid-sentence.",
     "Do not split U.S.A. or e.g. i.e. in mid-sentence."),
    ("(Klammern) [eckig] {geschweift} <spitz> |pipe| ~tilde~ ^caret^ `backtick`",
     "(Klammern) [eckig] {geschweift} <spitz> |pipe| ~tilde~ ^caret^ `backtick`"),
    ("dash – en — em − minus ‐ hyphen ‒ figure", "dash - en - em - minus - hyphen - figure"),
    ("a.b,c 1.a a.1 1,a a,1 1-a a-1 1-1 .5 ,5 5. 5,",
     "a.b,c 1.a a.1 1,a a,1 1-a a-1 1-1 .5 ,5 5. 5,"),
    ("Cafe\u0301 vs Café naïve coöperate", "Café vs Café naive cooperate"),
    ("a", "a a a a a a a a"),
    ("the the the the the the the", "the cat is on the mat"),
]

# Pairs with nothing in common (zero overlap for BLEU *and* chrF n-grams
# beyond a few shared letters).
ZERO = [
    ("xyz qwv", "Ein Hund läuft."),
    ("0815 4711", "Die Katze schläft."),
    ("Zzz", "Morgen regnet es."),
]

# Truncated hypotheses: strong brevity penalty, few higher-order matches.
SHORT_REFS = [
    "Ein Mann schläft in einem grünen Raum auf einem Sofa.",
    "Ein brauner Hund rennt dem schwarzen Hund hinterher.",
    "Zwei Männer bauen eine blaue Eisfischerhütte auf einem zugefrorenen See auf",
    "Eine Frau in einem roten Mantel geht mit ihrem Hund spazieren.",
    "Kinder spielen Fußball auf einer staubigen Straße.",
]
SHORT_HYPS = ["Ein Mann", "Hund", "Zwei Männer bauen", "Eine", "Kinder spielen Fußball"]

# Only unigram and bigram matches: exercises every smoothing method's handling
# of zero 3-gram/4-gram counts.
SPARSE = [
    ("Hund Katze Maus", "Katze Hund Maus"),
    ("der Mann Frau Kind", "der Mann und die Frau"),
]


def read_gz_lines(name, n):
    path = MULTI30K / name
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [fh.readline().rstrip("\n") for _ in range(n)]


def corrupt(words, rng, pool, strength):
    """Deterministically damage a tokenised sentence like a weak MT system."""
    words = list(words)
    for _ in range(strength):
        op = rng.randrange(7)
        if not words:
            break
        i = rng.randrange(len(words))
        if op == 0 and len(words) > 1:
            del words[i]
        elif op == 1:
            words.insert(i, words[i])
        elif op == 2 and i + 1 < len(words):
            words[i], words[i + 1] = words[i + 1], words[i]
        elif op == 3:
            words[i] = rng.choice(pool)
        elif op == 4:
            words[i] = words[i].lower() if words[i][:1].isupper() else words[i].capitalize()
        elif op == 5:
            words = words[: max(1, len(words) - rng.randrange(1, 4))]
        else:
            words[i] = words[i].rstrip(".,") + rng.choice([",", ".", " -", "!"])
    return " ".join(words)


def multi30k_corpus():
    refs = read_gz_lines("val.de.gz", 80) + read_gz_lines("test_2016_flickr.de.gz", 20)
    rng = random.Random(SEED)
    pool = sorted({w for line in refs for w in line.split()})
    hyps, alt = [], []
    for i, ref in enumerate(refs):
        words = ref.split()
        if i % 25 == 7:
            hyps.append("")  # a system that emitted nothing for this segment
        elif i % 25 == 11:
            hyps.append(ref)  # an exact hit
        else:
            hyps.append(corrupt(words, rng, pool, 1 + rng.randrange(4)))
        # The second "reference" is a lighter corruption: a plausible paraphrase.
        alt.append(corrupt(words, rng, pool, 1))
    return hyps, [refs, alt]


def corpora():
    hw_hyps = [row[0] for row in HANDWRITTEN]
    hw_refs = [[row[k] for row in HANDWRITTEN] for k in (1, 2, 3)]
    m30k_hyps, m30k_refs = multi30k_corpus()
    return {
        "handwritten": (hw_hyps, hw_refs),
        "multi30k": (m30k_hyps, m30k_refs),
        "cjk": ([r[0] for r in CJK], [[r[1] for r in CJK], [r[2] for r in CJK]]),
        "edge": ([r[0] for r in EDGE], [[r[1] for r in EDGE]]),
        "perfect": (hw_refs[0], [hw_refs[0]]),
        "zero": ([r[0] for r in ZERO], [[r[1] for r in ZERO]]),
        "short": (SHORT_HYPS, [SHORT_REFS]),
        "sparse": ([r[0] for r in SPARSE], [[r[1] for r in SPARSE]]),
        "allempty": (["", "", ""], [["", "Nur die Referenz.", ""]]),
    }


# ---------------------------------------------------------------------------
# Cases.
# ---------------------------------------------------------------------------

def bleu_cases():
    """(corpus, nrefs, options) triples for BLEU."""
    cases = []

    def add(corpus, nrefs, tokenize="13a", lowercase=False, smooth_method="exp",
            smooth_value=None, effective_order=False):
        cases.append((corpus, nrefs, dict(tokenize=tokenize, lowercase=lowercase,
                                          smooth_method=smooth_method,
                                          smooth_value=smooth_value,
                                          effective_order=effective_order)))

    for tok in ("13a", "intl", "none"):
        for lc in (False, True):
            add("handwritten", 1, tok, lc)
            add("multi30k", 1, tok, lc)
            add("edge", 1, tok, lc)
        add("handwritten", 2, tok)
        add("handwritten", 3, tok)
        add("multi30k", 2, tok)
        add("cjk", 1, tok)
        add("cjk", 2, tok)
    for corpus in ("perfect", "zero", "short", "sparse", "allempty"):
        for sm, sv in (("exp", None), ("floor", None), ("add-k", None), ("none", None),
                       ("floor", 0.5), ("add-k", 2)):
            add(corpus, 1, smooth_method=sm, smooth_value=sv)
        add(corpus, 1, effective_order=True)
    for sm, sv in (("floor", None), ("add-k", None), ("none", None), ("add-k", 0.5)):
        add("handwritten", 1, smooth_method=sm, smooth_value=sv)
        add("handwritten", 3, lowercase=True, smooth_method=sm, smooth_value=sv)
    add("handwritten", 1, effective_order=True)
    add("multi30k", 2, "intl", True, "floor")
    return cases


def chrf_cases():
    cases = []

    def add(corpus, nrefs, char_order=6, word_order=0, beta=2, lowercase=False,
            whitespace=False, eps_smoothing=False):
        cases.append((corpus, nrefs, dict(char_order=char_order, word_order=word_order,
                                          beta=beta, lowercase=lowercase,
                                          whitespace=whitespace,
                                          eps_smoothing=eps_smoothing)))

    for corpus, nrefs in (("handwritten", 1), ("handwritten", 2), ("handwritten", 3),
                          ("multi30k", 1), ("multi30k", 2), ("cjk", 1), ("cjk", 2),
                          ("edge", 1), ("perfect", 1), ("zero", 1), ("short", 1),
                          ("sparse", 1), ("allempty", 1)):
        add(corpus, nrefs)
        add(corpus, nrefs, word_order=2)  # chrF++
        add(corpus, nrefs, eps_smoothing=True)
    for corpus in ("handwritten", "edge", "multi30k"):
        add(corpus, 1, lowercase=True)
        add(corpus, 1, whitespace=True)
        add(corpus, 1, word_order=2, lowercase=True, eps_smoothing=True)
    add("handwritten", 3, char_order=4, word_order=1, beta=1)
    add("zero", 1, word_order=2, eps_smoothing=True)
    return cases


def bleu_expected(hyps, refs, opts):
    metric = BLEU(force=True, **opts)
    score = metric.corpus_score(hyps, refs)
    sig = metric.get_signature().format()
    # sacreBLEU's add-k adds k to the reported counts/totals; record the raw
    # n-gram statistics (they are what the Rust port reports) from a run that
    # leaves them untouched.
    raw = BLEU(force=True, **{**opts, "smooth_method": "none", "smooth_value": None})
    raw_score = raw.corpus_score(hyps, refs)
    return {
        "score": score.score,
        "score_repr": repr(score.score),
        "counts": [int(c) for c in raw_score.counts],
        "totals": [int(t) for t in raw_score.totals],
        "precisions": score.precisions,
        "bp": score.bp,
        "ratio": score.ratio,
        "sys_len": score.sys_len,
        "ref_len": score.ref_len,
        "signature": sig,
        "formatted": score.format(signature=sig),
    }


def chrf_expected(hyps, refs, opts):
    metric = CHRF(**opts)
    score = metric.corpus_score(hyps, refs)
    sig = metric.get_signature().format()
    # The per-order [hyp, ref, match] statistics (private API, but it is
    # exactly what `corpus_score` aggregates).
    stats = sum_of_lists(metric._extract_corpus_statistics(hyps, refs))
    return {
        "score": score.score,
        "score_repr": repr(score.score),
        "stats": [int(s) for s in stats],
        "signature": sig,
        "formatted": score.format(signature=sig),
    }


# Extra tokenizer inputs that cannot live in a line-based file.
TOKENIZER_EXTRAS = [
    "hyphen at line end-\nnext line",
    "two\nlines",
    "  leading and trailing  ",
    "&amp;quot; &quot;&amp; & ; &lt&gt;",
    "<skipped><skipped>x",
    "x.,y ,. 1.,2 a..b 1..2 1--2 a--b -1- 2-",
    "Ending with a year 2019.",
    "¿Qué? ¡Sí! «Oui» ‹non› „ja“ ‚nein‘ 「はい」 『いいえ』",
    "٣٫٥ ٣،٥ 3.5 3,5 ³.5 Ⅻ.5 ½,5",
    "\u00a0\u2028\u2029\u0085\x0b\x0c\x1c\x1d\x1e\x1f",
    "ΣΑΣ. ΟΔΟΣ, Σ ΑΣ' İI ẞ Ǆ ﬃ",
]

TOKENIZER_POOL = (
    list("abcXYZäöüßÄÖÜ019٣３²½") + list(".,-:;!?'\"()[]{}<>/\\|&@#$%^*+=~`_")
    + list("„“”‚‘’«»‹›–—−…·•€£¥©®™±×÷→∞°§¶†‡") + list("中文。、！？「」（）한국")
    + [" ", " ", " ", "\t", "\u00a0", "\u3000", "\u2009", "\x1c", "\x1f", "\u200b"]
    + ["&amp;", "&quot;", "&lt;", "&gt;", "<skipped>", "Σ", "İ", "😀", "e\u0301"]
)


def tokenizer_table(all_lines):
    tokenizers = {name: BLEU(tokenize=name).tokenizer for name in ("13a", "intl", "none")}
    rng = random.Random(SEED + 1)
    inputs = list(dict.fromkeys(all_lines + TOKENIZER_EXTRAS))
    for _ in range(200):
        inputs.append("".join(rng.choice(TOKENIZER_POOL) for _ in range(rng.randrange(1, 40))))
    table = []
    for s in inputs:
        # Mirror BLEU._preprocess_segment (lower(), rstrip(), tokenizer) and
        # the `split()` that extract_all_word_ngrams applies afterwards.
        def toks(name, lowercase=False):
            line = s.lower() if lowercase else s
            return " ".join(tokenizers[name](line.rstrip()).split())
        table.append({
            "input": s,
            "13a": toks("13a"),
            "intl": toks("intl"),
            "none": toks("none"),
            "13a_lc": toks("13a", lowercase=True),
        })
    return table


def write_lines(path, lines):
    for line in lines:
        assert "\n" not in line and "\r" not in line, line
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    data = corpora()
    files = {}
    for name, (hyps, refs) in data.items():
        write_lines(OUT / f"{name}.hyp.txt", hyps)
        files[name] = {"hyp": f"{name}.hyp.txt", "refs": []}
        for k, stream in enumerate(refs):
            assert len(stream) == len(hyps), name
            write_lines(OUT / f"{name}.ref{k}.txt", stream)
            files[name]["refs"].append(f"{name}.ref{k}.txt")

    cases = []
    for corpus, nrefs, opts in bleu_cases():
        hyps, refs = data[corpus]
        cases.append({"metric": "bleu", "corpus": corpus, "nrefs": nrefs, "options": opts,
                      "expected": bleu_expected(hyps, refs[:nrefs], opts)})
    for corpus, nrefs, opts in chrf_cases():
        hyps, refs = data[corpus]
        cases.append({"metric": "chrf", "corpus": corpus, "nrefs": nrefs, "options": opts,
                      "expected": chrf_expected(hyps, refs[:nrefs], opts)})
    for i, case in enumerate(cases):
        o = case["options"]
        case["name"] = f"{i:03d}-{case['metric']}-{case['corpus']}-{case['nrefs']}ref-" + "-".join(
            f"{k}={v}" for k, v in o.items())

    # Sentence-level scores with sacreBLEU's `sentence_bleu`/`sentence_chrf`
    # defaults (BLEU: effective order + exp smoothing), all references.
    sentence = []
    for corpus in ("handwritten", "cjk", "edge", "short"):
        hyps, refs = data[corpus]
        for i, hyp in enumerate(hyps):
            seg_refs = [stream[i] for stream in refs]
            sentence.append({
                "corpus": corpus, "line": i, "hyp": hyp, "refs": seg_refs,
                "bleu": repr(sacrebleu.sentence_bleu(hyp, seg_refs).score),
                "chrf": repr(sacrebleu.sentence_chrf(hyp, seg_refs).score),
            })

    # Multi30k lines are plain German prose; the hand-written corpora hold the
    # interesting tokenisation cases.
    all_lines = []
    for name, (hyps, refs) in data.items():
        if name == "multi30k":
            continue
        all_lines += hyps
        for stream in refs:
            all_lines += stream

    expected = {
        "generator": "scripts/make-bleu-fixtures.py",
        "sacrebleu_version": sacrebleu.__version__,
        "seed": SEED,
        "corpora": files,
        "cases": cases,
        "sentence": sentence,
        "tokenization": tokenizer_table(all_lines),
    }
    (OUT / "expected.json").write_text(
        json.dumps(expected, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases, {len(sentence)} sentence scores, "
          f"{len(expected['tokenization'])} tokenisations to {OUT}")


if __name__ == "__main__":
    main()
