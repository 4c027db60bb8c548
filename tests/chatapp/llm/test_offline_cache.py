"""The offline engine remembers the passages it parsed from a system prompt: the same
prompt gives the same evidence, parsed once, and a caller changing its list changes nothing
remembered."""

from __future__ import annotations

from chatapp.llm.offline import evidence

PROMPT = (
    "Answer from the passages.\n\nKnowledge base passages:\n\n"
    "[1] Kestrel Sync limits\nFile limits\n\nThe largest single file is 50 GB on paid plans."
)


def test_a_system_prompt_seen_again_is_not_parsed_again():
    evidence._passages_of.cache_clear()
    first = evidence._passages(PROMPT)
    first.clear()  # the caller's own list
    second = evidence._passages(PROMPT)

    info = evidence._passages_of.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert [passage.sentences for passage in second] == [("The largest single file is 50 GB on paid plans.",)]
    assert second[0].sections == ("File limits",)
