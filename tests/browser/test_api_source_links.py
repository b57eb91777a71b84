"""The API page links every class and function to its highlighted source (sphinx.ext.viewcode).

A reader clicks ``[source]`` beside a name and lands, offline, on the highlighted module at that
name's definition; every such link on the page leads to a page of the built book.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from book_pages import HTML, open_page, page_file

pytestmark = pytest.mark.browser


def test_every_source_link_on_the_api_page_leads_to_a_built_page(offline_page):
    page, recorder = offline_page
    open_page(page, page_file("book/api").as_uri())
    links = page.eval_on_selector_all(
        "a:has(> .viewcode-link)", "links => links.map(a => a.href)")
    assert len(links) >= 20, f"the API page shows {len(links)} [source] links; is sphinx.ext.viewcode on?"
    missing = sorted({urlsplit(link).path for link in links} - {p.as_uri()[len("file://"):]
                                                               for p in HTML.rglob("*.html")})
    assert not missing, f"[source] links to pages that were not built: {missing}"
    assert not recorder.problems, recorder.problems


def test_a_source_link_opens_the_class_highlighted_offline(offline_page):
    page, recorder = offline_page
    open_page(page, page_file("book/api").as_uri())
    page.locator('a[href$="causal_attention.html#CausalAttention"]:has(> .viewcode-link)').first.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("_modules/mha_course/attention/causal_attention.html#CausalAttention")
    target = page.locator('[id="CausalAttention"]')
    assert target.count() == 1 and "class CausalAttention" in target.inner_text()
    assert page.locator("div.highlight span.k").count() > 0, "the source is not syntax-highlighted"
    assert not recorder.problems, recorder.problems
