#!/usr/bin/env python3
"""Checks every relative link in README.md and docs/*.md: the file it names exists and, for a
Markdown target, the #anchor is one of its headings (GitHub's slugs: lower case, punctuation
dropped, spaces to hyphens, -1, -2 ... for repeats). Prints each broken link as file:line and
exits 1 if there is one. Usage: check-doc-links.py ROOT (the repository, or a test fixture)."""
import glob
import os
import re
import sys

FENCE = re.compile(r"^```")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def lines_outside_fences(path):
    inside = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                inside = not inside
            elif not inside:
                yield number, line


def anchors(path):
    seen, result = {}, set()
    for _, line in lines_outside_fences(path):
        m = HEADING.match(line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def main(root):
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    broken = 0
    for source in files:
        for number, line in lines_outside_fences(source):
            for link in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z]+:", link):
                    continue  # http(s), mailto: not checked offline
                path, _, anchor = link.partition("#")
                target = os.path.normpath(os.path.join(os.path.dirname(source), path)) if path else source
                if not os.path.exists(target):
                    print(f"{source}:{number}: link to a missing file: {link}")
                    broken += 1
                elif anchor and target.endswith(".md") and anchor not in anchors(target):
                    print(f"{source}:{number}: link to a missing heading: {link}")
                    broken += 1
    print(f"check-doc-links: {len(files)} files, {broken} broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
