//! The documentation against the code it describes: every `ringlimit serve` flag and variable
//! (read from clap) is in the flags reference, every exported metric family (read from
//! `metrics/names.txt`, the `/metrics` contract) is in the metrics reference, every relative link
//! of the repository's Markdown resolves (files and `#anchors`), every page of `docs/src` is in
//! the book's summary, nothing points outside the repository, the SDK guide's program is the one
//! this file compiles, and the benchmark tables the docs and `bench/README.md` both show agree.
//! No node is started: these read files.

use clap::CommandFactory;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

// The SDK guide's first program (docs/src/guides/sdk.md shows it whole), compiled here so that
// the guide cannot drift from the SDK. It is run against a cluster by hand, as the guide says.
#[allow(dead_code)]
#[path = "../../docs/examples/sdk_quickstart.rs"]
mod sdk_quickstart;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether `text` holds `word` with no identifier character (letter, digit, `_`, `-`) either
/// side: `--http` must not be found inside `--http-threads`.
fn holds_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[test]
fn every_serve_flag_and_its_variable_are_in_the_reference() {
    let page = read(&repo().join("docs/src/reference/serve.md"));
    let cli = ringlimit_node::config::Cli::command();
    let serve = cli
        .find_subcommand("serve")
        .expect("the ringlimit command has `serve`");
    let mut missing = Vec::new();
    let mut seen = 0;
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        seen += 1;
        let flag = format!("--{long}");
        if !holds_word(&page, &flag) {
            missing.push(flag);
        }
        if let Some(env) = arg.get_env().and_then(|e| e.to_str())
            && !holds_word(&page, env)
        {
            missing.push(env.to_owned());
        }
    }
    assert!(seen > 30, "only {seen} serve flags read from clap");
    assert!(
        missing.is_empty(),
        "missing from docs/src/reference/serve.md: {missing:?}"
    );
}

/// The names a scrape shows for each family of `names.txt`: counters end in `_total`.
fn exported_families() -> BTreeSet<String> {
    let names = read(&repo().join("crates/node/src/metrics/names.txt"));
    names
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| match l.split_once(' ') {
            Some((name, "counter")) => format!("{name}_total"),
            Some((name, _)) => name.to_owned(),
            None => panic!("names.txt: a TYPE line without a type: {l}"),
        })
        .collect()
}

#[test]
fn every_exported_metric_is_in_the_reference() {
    let page = read(&repo().join("docs/src/reference/metrics.md"));
    let families = exported_families();
    assert!(families.len() > 100, "only {} families", families.len());
    let missing: Vec<_> = families
        .iter()
        .filter(|f| !holds_word(&page, &format!("`{f}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "missing from docs/src/reference/metrics.md (one row each, the name in backticks): {missing:?}"
    );
}

/// The Markdown files whose links are checked: the front page, the changelog, the docs, the
/// benchmark pages and the Kubernetes base's README.
fn markdown_files() -> Vec<PathBuf> {
    let top = repo();
    let mut files = vec![top.join("README.md"), top.join("CHANGELOG.md")];
    for dir in ["docs/src", "bench", "deploy"] {
        collect_md(&top.join(dir), &mut files);
    }
    files.sort();
    files
}

fn collect_md(dir: &Path, into: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() && name != "out" {
            collect_md(&path, into);
        } else if name.ends_with(".md") {
            into.push(path);
        }
    }
}

/// The text of a Markdown file outside code: fenced blocks and inline code spans blanked, so
/// that neither their links nor their `#` lines count.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => {
                let mut in_code = false;
                for c in line.chars() {
                    if c == '`' {
                        in_code = !in_code;
                    } else if !in_code {
                        out.push(c);
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

/// Inline links' targets, `[text](target)` and `![alt](target)`, with an optional title cut.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_owned());
        rest = &rest[end..];
    }
    targets
}

/// mdBook's id of a heading (GitHub's is the same for the headings here): its text without
/// Markdown, lower-cased, spaces to `-`, only letters, digits, `_` and `-` kept.
fn heading_id(heading: &str) -> String {
    let mut text = String::new();
    let mut chars = heading.chars().peekable();
    // Links keep their text only.
    while let Some(c) = chars.next() {
        match c {
            '[' => {}
            ']' if chars.peek() == Some(&'(') => {
                for c in chars.by_ref() {
                    if c == ')' {
                        break;
                    }
                }
            }
            '`' | '*' => {}
            c => text.push(c),
        }
    }
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown file's headings, a repeated one numbered as mdBook does (`-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = !fence;
            continue;
        }
        if fence || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let id = heading_id(heading);
        let n = seen.entry(id.clone()).or_insert(0);
        out.insert(if *n == 0 {
            id.clone()
        } else {
            format!("{id}-{n}")
        });
        *n += 1;
    }
    out
}

/// `base/rel` with `.` and `..` folded, without touching the file system.
fn join(base: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in base.join(rel).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let top = repo();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let dir = file.parent().expect("a file has a directory");
        for target in link_targets(&prose(&text)) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                join(dir, path)
            };
            let shown = file
                .strip_prefix(&top)
                .unwrap_or(&file)
                .display()
                .to_string();
            if !resolved.starts_with(&top) {
                broken.push(format!("{shown}: {target} (outside the repository)"));
                continue;
            }
            if !resolved.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor {
                let is_md = resolved.extension().is_some_and(|e| e == "md");
                if is_md && !anchors(&read(&resolved)).contains(anchor) {
                    broken.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(checked > 200, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_in_the_summary_and_the_summary_reaches_the_readme() {
    let src = repo().join("docs/src");
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = link_targets(&prose(&summary))
        .iter()
        .map(|t| join(&src, t))
        .collect();
    let mut pages = Vec::new();
    collect_md(&src, &mut pages);
    let missing: Vec<_> = pages
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "SUMMARY.md") && !listed.contains(*p))
        .map(|p| p.strip_prefix(&src).unwrap_or(p).display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src pages not in SUMMARY.md (unreachable from the index): {missing:?}"
    );
    // The front page reaches every page of the book in one click.
    let readme = read(&repo().join("README.md"));
    let linked: BTreeSet<PathBuf> = link_targets(&prose(&readme))
        .iter()
        .map(|t| join(&repo(), t.split('#').next().unwrap_or(t)))
        .collect();
    let unlinked: Vec<_> = listed
        .iter()
        .filter(|p| !linked.contains(*p))
        .map(|p| p.strip_prefix(&src).unwrap_or(p).display().to_string())
        .collect();
    assert!(
        unlinked.is_empty(),
        "docs pages the README does not link to: {unlinked:?}"
    );
}

#[test]
fn nothing_points_outside_the_repository() {
    // Spelt in pieces so that this file does not name them itself.
    let outside = [
        ["shared", "/contract.md"].concat(),
        ["shared", "/design.md"].concat(),
        ["shared", "/style.md"].concat(),
        ["beside this ", "repository"].concat(),
        ["/work", "/shared"].concat(),
    ];
    let top = repo();
    let mut files = Vec::new();
    for dir in ["crates", "tests", "bench", "deploy", "docs", "fuzz", ".ci"] {
        collect_text(&top.join(dir), &mut files);
    }
    for name in ["README.md", "CHANGELOG.md", "Cargo.toml", "Dockerfile"] {
        files.push(top.join(name));
    }
    let mut found = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for needle in &outside {
            if text.contains(needle.as_str()) {
                let shown = file
                    .strip_prefix(&top)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                found.push(format!("{shown}: {needle}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "references outside the repository: {found:?}"
    );
}

fn collect_text(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !matches!(name, "out" | "book" | "target" | "__pycache__") {
                collect_text(&path, into);
            }
        } else if !name.ends_with(".js") {
            into.push(path);
        }
    }
}

#[test]
fn the_sdk_guide_shows_the_program_this_file_compiles() {
    let guide = read(&repo().join("docs/src/guides/sdk.md"));
    let program = read(&repo().join("docs/examples/sdk_quickstart.rs"));
    assert!(
        guide.contains(&format!("```rust\n{program}```")),
        "docs/src/guides/sdk.md must show docs/examples/sdk_quickstart.rs whole, as one rust block"
    );
}

/// The `<!-- current: NAME -->` ... `<!-- end -->` blocks of a file, by name.
fn current_tables(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some(at) = rest.find("<!-- current: ") {
        rest = &rest[at + "<!-- current: ".len()..];
        let Some(close) = rest.find(" -->") else {
            break;
        };
        let name = rest[..close].to_owned();
        let body = &rest[close + " -->".len()..];
        let Some(end) = body.find("<!-- end -->") else {
            break;
        };
        out.insert(name, body[..end].trim().to_owned());
        rest = &body[end..];
    }
    out
}

#[test]
fn the_benchmark_tables_of_the_docs_and_of_bench_readme_agree() {
    let top = repo();
    let bench = current_tables(&read(&top.join("bench/README.md")));
    let mut docs = current_tables(&read(&top.join("docs/src/benchmarks.md")));
    docs.extend(current_tables(&read(&top.join("docs/src/accuracy.md"))));
    assert!(
        docs.len() > 20,
        "only {} current tables in the docs",
        docs.len()
    );
    let names: BTreeSet<_> = bench.keys().chain(docs.keys()).collect();
    let differ: Vec<_> = names
        .into_iter()
        .filter(|n| bench.get(*n) != docs.get(*n))
        .collect();
    assert!(
        differ.is_empty(),
        "tables that differ (or are missing) between bench/README.md and docs/src: {differ:?}"
    );
}

#[test]
fn heading_ids_are_mdbooks() {
    assert_eq!(heading_id(" `POST /v1/check/all`"), "post-v1checkall");
    assert_eq!(
        heading_id(" What `--replicas 1` costs"),
        "what---replicas-1-costs"
    );
    assert_eq!(
        heading_id(" Partitions: the majority rule"),
        "partitions-the-majority-rule"
    );
    assert_eq!(heading_id(" [Link](x.md) text"), "link-text");
}
