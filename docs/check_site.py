"""Checks a built mdBook site: every local link and resource of every page resolves (the file
exists; a #fragment names an id on the target page), and every page is reachable from
index.html by following links. Exits 1 with one line per problem.

    python3 docs/check_site.py docs/book

Links out of the book (to repository files such as bench/notes/) are checked on disk: the book
is built inside the repository, at the same depth as its sources. print.html, which mdBook makes
from every page with rewritten links, and 404.html are not checked.
"""
import os
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

SKIPPED = {"print.html", "404.html", "toc.html"}


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()
        self.links = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for attr in ("href", "src"):
            value = attrs.get(attr)
            if value is not None and tag in ("a", "link", "script", "img"):
                self.links.append(value)


def parse(path):
    page = Page()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    return page


def main(book):
    book = os.path.realpath(book)
    pages = {}
    for root, _dirs, files in os.walk(book):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(root, name)
                pages[path] = parse(path)
    index = os.path.join(book, "index.html")
    if index not in pages:
        print(f"{book}: no index.html")
        return 1

    problems = []
    graph = {}
    for path, page in sorted(pages.items()):
        if os.path.basename(path) in SKIPPED:
            continue
        shown = os.path.relpath(path, book)
        graph[path] = set()
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("javascript:"):
                continue
            target = path if not parts.path else os.path.normpath(
                os.path.join(os.path.dirname(path), unquote(parts.path)))
            if not os.path.exists(target):
                problems.append(f"{shown}: {link}: no such file")
                continue
            if os.path.isdir(target):
                continue
            if target in pages:
                graph[path].add(target)
                if parts.fragment and unquote(parts.fragment) not in pages[target].ids:
                    problems.append(f"{shown}: {link}: no such anchor")

    seen = {index}
    todo = [index]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    for path in sorted(graph):
        if path not in seen:
            problems.append(f"{os.path.relpath(path, book)}: not reachable from index.html")

    for p in problems:
        print(p)
    checked = sum(len(p.links) for p in pages.values())
    print(f"docs: {len(graph)} pages, {checked} links and resources checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/book"))
