//! How droverctl prints what the API returns: whole messages as JSON or
//! YAML (their serde impls are generated from the proto, so every field
//! shows, as the proto names it), bare names for scripts (`-o name`), or
//! aligned tables, with more columns under `-o wide`.

use clap::ValueEnum;
use serde::Serialize;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// The table with more columns.
    Wide,
    /// Whole messages, JSON (the proto3 JSON mapping, proto field names).
    Json,
    /// Whole messages, YAML.
    Yaml,
    /// One name per line, e.g. for `xargs`.
    Name,
}

impl Output {
    /// Prints `items` as whole messages when the format asks for them: a
    /// list as an array whatever its length, a single result as an object.
    /// Returns false for the formats the caller renders itself (table,
    /// wide, name).
    pub fn messages<T: Serialize>(self, items: &[T], list: bool) -> bool {
        let Some(text) = self.messages_text(items, list) else {
            return false;
        };
        outln!("{text}");
        true
    }

    /// What [`Output::messages`] prints, `None` for table, wide and name.
    fn messages_text<T: Serialize>(self, items: &[T], list: bool) -> Option<String> {
        let value = match items {
            [one] if !list => serde_json::to_value(one),
            many => serde_json::to_value(many),
        }
        .expect("generated messages serialize");
        match self {
            Output::Json => Some(serde_json::to_string_pretty(&value).expect("json")),
            Output::Yaml => Some(yaml_text(&value)),
            Output::Table | Output::Wide | Output::Name => None,
        }
    }

    /// One message as a single line of JSON, for streams (`watch -o json`).
    pub fn line<T: Serialize>(self, item: &T) -> bool {
        match self {
            Output::Json => outln!("{}", serde_json::to_string(item).expect("json")),
            Output::Yaml => outln!(
                "---\n{}",
                yaml_serde::to_string(item).expect("yaml").trim_end()
            ),
            Output::Table | Output::Wide | Output::Name => return false,
        }
        true
    }

    pub fn is_wide(self) -> bool {
        self == Output::Wide
    }
}

fn yaml_text(value: &serde_json::Value) -> String {
    yaml_serde::to_string(value)
        .expect("yaml")
        .trim_end()
        .to_string()
}

/// A list printed page by page as its pages arrive, so that droverctl holds
/// one page however long the list (100,000 clusters): with `-o json` and
/// `-o yaml` it writes, item by item, the very document
/// [`Output::messages`] prints for the whole list at once (one JSON array,
/// one YAML sequence), so a reader sees no difference but the pace. A
/// page shows as soon as it arrives, but for the closing line of its last
/// JSON element (whether a comma follows is known with the next page).
pub struct Listing {
    output: Output,
    /// The closing line of the last JSON element written, held back until
    /// the next element or the end says whether a comma follows it.
    held: Option<String>,
    /// Whether an item was written: an empty list is `[]`.
    started: bool,
}

impl Listing {
    pub fn new(output: Output) -> Self {
        Listing {
            output,
            held: None,
            started: false,
        }
    }

    /// Prints the next page's `items`. Returns false for the formats the
    /// caller renders itself (table, wide, name).
    pub fn page<T: Serialize>(&mut self, items: &[T]) -> bool {
        let Some(text) = self.page_text(items) else {
            return false;
        };
        if !text.is_empty() {
            outln!("{text}");
        }
        true
    }

    fn page_text<T: Serialize>(&mut self, items: &[T]) -> Option<String> {
        let json = match self.output {
            Output::Json => true,
            Output::Yaml => false,
            Output::Table | Output::Wide | Output::Name => return None,
        };
        let mut lines = Vec::new();
        for item in items {
            // Through a `Value`, as `messages` goes: its fields in the same
            // order.
            let value = serde_json::to_value(item).expect("generated messages serialize");
            if json {
                let pretty = serde_json::to_string_pretty(&value).expect("json");
                // Indented as an element of the whole array would be.
                let mut element: Vec<String> = pretty.lines().map(|l| format!("  {l}")).collect();
                let closing = element.pop().expect("a closing line");
                match self.held.replace(closing) {
                    Some(before) => lines.push(format!("{before},")),
                    None => lines.push("[".into()),
                }
                lines.extend(element);
            } else {
                // A sequence of one; one after another they read as the
                // sequence of them all.
                lines.push(yaml_text(&serde_json::Value::Array(vec![value])));
            }
            self.started = true;
        }
        Some(lines.join("\n"))
    }

    /// Ends the document: the JSON array's last element and its bracket,
    /// or `[]` for a list with nothing in it.
    pub fn end(self) {
        if let Some(text) = self.end_text() {
            outln!("{text}");
        }
    }

    fn end_text(self) -> Option<String> {
        match (self.output, self.held) {
            (Output::Json, Some(last)) => Some(format!("{last}\n]")),
            (Output::Json | Output::Yaml, _) if !self.started => Some("[]".into()),
            _ => None,
        }
    }
}

/// A table of aligned columns, kubectl style: a header line, no borders.
/// Printed at once, or page by page as a listing arrives ([`Table::print`]
/// after each page's rows), holding one page: the header comes once, with
/// the first page, and a column stays as wide as its widest cell printed
/// so far, so later pages line up under the earlier ones unless they hold
/// a wider cell, which widens its column from that page on.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Each column's width so far; empty until the first print.
    widths: Vec<u16>,
}

impl Table {
    pub fn new<'a>(header: impl IntoIterator<Item = &'a str>) -> Self {
        Table {
            header: header.into_iter().map(String::from).collect(),
            rows: Vec::new(),
            widths: Vec::new(),
        }
    }

    /// Adds a row of cells, in the header's order.
    pub fn row<I: IntoIterator<Item = String>>(&mut self, cells: I) -> &mut Self {
        self.rows.push(cells.into_iter().collect());
        self
    }

    /// Prints the rows added since the last print, after the header the
    /// first time.
    pub fn print(&mut self) {
        for line in self.page_lines() {
            outln!("{line}");
        }
    }

    fn page_lines(&mut self) -> Vec<String> {
        use comfy_table::{ColumnConstraint::LowerBoundary, Width::Fixed};
        const GAP: u16 = 2;
        let mut table = comfy_table::Table::new();
        table
            .load_preset(comfy_table::presets::NOTHING)
            .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
            .set_header(&self.header)
            .add_rows(self.rows.drain(..));
        for (index, column) in table.column_iter_mut().enumerate() {
            // No left padding: the first column starts at the margin.
            column.set_padding((0, GAP));
            if let Some(width) = self.widths.get(index) {
                column.set_constraint(LowerBoundary(Fixed(width + GAP)));
            }
        }
        let widths = table.column_max_content_widths();
        let header_printed = !self.widths.is_empty();
        self.widths.resize(widths.len(), 0);
        for (kept, width) in self.widths.iter_mut().zip(widths) {
            *kept = (*kept).max(width);
        }
        let lines = table.lines().map(|line| line.trim_end().to_string());
        // The header is the first line; later pages go without it.
        lines.skip(usize::from(header_printed)).collect()
    }
}

/// `  Key:  value`, aligned at a fixed column, `kubectl describe` style
/// (`cluster describe`, `rollout get`); an empty value shows as `-`.
pub fn field(indent: usize, key: &str, value: &str) {
    let key = format!("{}{key}:", "  ".repeat(indent));
    outln!("{key:<18}{}", if value.is_empty() { "-" } else { value });
}

/// Labels as `key=value`, sorted.
pub fn label_pairs(labels: &std::collections::HashMap<String, String>) -> Vec<String> {
    let mut pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs
}

/// Time since `at`, as kubectl shows ages: `42s`, `7m`, `5h`, `3d`.
pub fn age(at: Option<&drover_proto::Timestamp>) -> String {
    let Some(at) = at else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let secs = (now - at.seconds).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let ago = |secs: i64| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            age(Some(&drover_proto::Timestamp {
                seconds: now - secs,
                nanos: 0,
            }))
        };
        assert_eq!(ago(5), "5s");
        assert_eq!(ago(600), "10m");
        assert_eq!(ago(3 * 3600), "3h");
        assert_eq!(ago(5 * 86400), "5d");
        assert_eq!(age(None), "-");
    }

    /// Page by page, however the pages fall (an empty one too), a listing
    /// writes the document the whole list makes at once.
    #[test]
    fn a_listing_writes_what_the_whole_list_reads_as() {
        // Nested messages and a map: indentation to get right.
        let cluster = |name: &str| drover_client::v1::Cluster {
            name: name.into(),
            spec: Some(drover_client::v1::ClusterSpec {
                labels: [("team".into(), name.into())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let all: Vec<_> = ["a", "b", "c"].map(cluster).into();
        let pagings: [&[&[drover_client::v1::Cluster]]; 4] =
            [&[], &[&[]], &[&all[..1]], &[&all[..1], &[], &all[1..]]];
        for output in [Output::Json, Output::Yaml] {
            for pages in pagings {
                let mut listing = Listing::new(output);
                let mut texts: Vec<String> = pages
                    .iter()
                    .map(|page| listing.page_text(page).expect("a document format"))
                    .filter(|text| !text.is_empty())
                    .collect();
                texts.extend(listing.end_text());
                let whole: Vec<_> = pages.concat();
                assert_eq!(
                    texts.join("\n"),
                    output.messages_text(&whole, true).unwrap(),
                    "{} in {} pages",
                    whole.len(),
                    pages.len()
                );
            }
        }
        assert_eq!(Listing::new(Output::Table).page_text(&all), None);
    }

    #[test]
    fn a_table_page_by_page_has_one_header_and_its_columns_only_widen() {
        let mut table = Table::new(["NAME", "STATE"]);
        let mut page = |rows: &[[&str; 2]]| {
            for row in rows {
                table.row(row.map(String::from));
            }
            table.page_lines()
        };
        assert_eq!(page(&[["a", "RUNNING"]]), ["NAME  STATE", "a     RUNNING"]);
        assert!(page(&[]).is_empty(), "an empty page prints nothing");
        assert_eq!(page(&[["b", "STOPPED"]]), ["b     STOPPED"]);
        assert_eq!(page(&[["longer", "ALERT"]]), ["longer  ALERT"]);
        assert_eq!(page(&[["c", "CREATED"]]), ["c       CREATED"]);
    }

    #[test]
    fn messages_carry_every_field_by_its_proto_name() {
        let cluster = drover_client::v1::Cluster {
            name: "web".into(),
            generation: 2,
            ..Default::default()
        };
        let value = serde_json::to_value(&cluster).unwrap();
        assert_eq!(value["name"], "web");
        // The proto3 JSON mapping: 64-bit integers as strings.
        assert_eq!(value["generation"], "2");
        // Defaults show too.
        assert_eq!(value["revision"], "0");
    }
}
