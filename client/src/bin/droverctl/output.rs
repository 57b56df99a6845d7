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
        let value = match items {
            [one] if !list => serde_json::to_value(one),
            many => serde_json::to_value(many),
        }
        .expect("generated messages serialize");
        match self {
            Output::Json => outln!("{}", serde_json::to_string_pretty(&value).expect("json")),
            Output::Yaml => outln!(
                "{}",
                yaml_serde::to_string(&value).expect("yaml").trim_end()
            ),
            Output::Table | Output::Wide | Output::Name => return false,
        }
        true
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

/// A table of aligned columns, kubectl style: a header line, no borders.
pub struct Table(comfy_table::Table);

impl Table {
    pub fn new<'a>(header: impl IntoIterator<Item = &'a str>) -> Self {
        let mut table = comfy_table::Table::new();
        table
            .load_preset(comfy_table::presets::NOTHING)
            .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
            .set_header(header.into_iter().collect::<Vec<_>>());
        Table(table)
    }

    /// Adds a row of cells, in the header's order.
    pub fn row<I: IntoIterator<Item = String>>(&mut self, cells: I) -> &mut Self {
        self.0.add_row(cells.into_iter().collect::<Vec<_>>());
        self
    }

    pub fn print(&mut self) {
        for column in self.0.column_iter_mut() {
            // No left padding: the first column starts at the margin.
            column.set_padding((0, 2));
        }
        for line in self.0.lines() {
            outln!("{}", line.trim_end());
        }
    }
}

/// `  Key:  value`, aligned at a fixed column, `kubectl describe` style
/// (`cluster describe`, `rollout get`); an empty value shows as `-`.
pub fn field(indent: usize, key: &str, value: &str) {
    let key = format!("{}{key}:", "  ".repeat(indent));
    outln!("{key:<18}{}", if value.is_empty() { "-" } else { value });
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
