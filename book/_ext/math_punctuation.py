"""Keep the punctuation after inline math on the same line as the math.

MathJax draws inline math as an inline block, and browsers may break a line right after one, so
"... weight $W_q$, then ..." can put the comma alone at the start of the next line. This wraps
each inline math node and the punctuation that follows it (``,`` ``.`` ``;`` ``:`` ``)`` ...) in
``<span class="math-nowrap">``, which ``book/_static/book.css`` keeps on one line. The words
around it still wrap as usual.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.transforms import SphinxTransform

# Characters that belong to the text before them: closing punctuation and quotes, an apostrophe.
TRAILING_PUNCTUATION = re.compile(r"^[.,;:!?)\]}'\u2019\u201d\u2026]+")


class KeepPunctuationWithMath(SphinxTransform):
    default_priority = 700

    def apply(self, **kwargs) -> None:
        for math in list(self.document.findall(nodes.math)):
            parent = math.parent
            if parent is None or isinstance(parent, nodes.inline) and "math-nowrap" in parent["classes"]:
                continue
            index = parent.index(math)
            after = parent[index + 1] if index + 1 < len(parent) else None
            if not isinstance(after, nodes.Text):
                continue
            text = after.astext()
            match = TRAILING_PUNCTUATION.match(text)
            if not match:
                continue
            wrapper = nodes.inline(classes=["math-nowrap"])
            parent.replace(math, wrapper)
            wrapper += math
            wrapper += nodes.Text(match.group(0))
            rest = text[match.end():]
            if rest:
                parent.replace(after, nodes.Text(rest))
            else:
                parent.remove(after)


def setup(app):
    app.add_transform(KeepPunctuationWithMath)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
