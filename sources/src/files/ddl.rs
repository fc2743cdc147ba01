//! Schemas as Spark DDL text (`id BIGINT, name STRING, tags ARRAY<STRING>`): parsed from the
//! file source's `schema` option and written into the checkpoint, so the schema a query reads
//! with is readable there and can be pasted back as an option.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};
use weir_common::ClassifiedError;

fn invalid(ddl: &str, what: impl std::fmt::Display) -> ClassifiedError {
    ClassifiedError::new(
        "INVALID_SCHEMA",
        "42K07",
        format!(
            "The schema '{ddl}' cannot be parsed: {what}. Write it as Spark DDL, e.g. \
             'id BIGINT, name STRING, at TIMESTAMP, tags ARRAY<STRING>'."
        ),
    )
}

/// Parses `a BIGINT, b STRING NOT NULL, c STRUCT<x: INT, y: DOUBLE>`.
pub fn parse_ddl(ddl: &str) -> Result<Schema, ClassifiedError> {
    let tokens = tokenize(ddl).map_err(|e| invalid(ddl, e))?;
    let mut p = Parser { tokens, pos: 0 };
    let fields = p.fields(None).map_err(|e| invalid(ddl, e))?;
    if p.pos != p.tokens.len() {
        return Err(invalid(ddl, format!("unexpected '{}'", p.tokens[p.pos])));
    }
    if fields.is_empty() {
        return Err(invalid(ddl, "it names no column"));
    }
    let mut seen = std::collections::HashSet::new();
    for f in &fields {
        if !seen.insert(f.name().to_ascii_lowercase()) {
            return Err(invalid(
                ddl,
                format!("the column '{}' appears twice", f.name()),
            ));
        }
    }
    Ok(Schema::new(fields))
}

/// The DDL text of `schema`, which [`parse_ddl`] reads back to the same schema; `None` if a
/// type has no DDL name.
pub fn to_ddl(schema: &Schema) -> Option<String> {
    schema
        .fields()
        .iter()
        .map(|f| field_ddl(f, " "))
        .collect::<Option<Vec<_>>>()
        .map(|v| v.join(", "))
}

fn quote(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        name.to_string()
    } else {
        format!("`{}`", name.replace('`', "``"))
    }
}

fn field_ddl(f: &Field, sep: &str) -> Option<String> {
    let not_null = if f.is_nullable() { "" } else { " NOT NULL" };
    Some(format!(
        "{}{sep}{}{not_null}",
        quote(f.name()),
        type_ddl(f.data_type())?
    ))
}

fn type_ddl(t: &DataType) -> Option<String> {
    Some(match t {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Utf8 => "STRING".into(),
        DataType::Binary => "BINARY".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(tz)) if tz.as_ref() == "UTC" => {
            "TIMESTAMP".into()
        }
        DataType::Timestamp(TimeUnit::Microsecond, None) => "TIMESTAMP_NTZ".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        DataType::List(f) => format!("ARRAY<{}>", type_ddl(f.data_type())?),
        DataType::Struct(fields) => format!(
            "STRUCT<{}>",
            fields
                .iter()
                .map(|f| field_ddl(f, ": "))
                .collect::<Option<Vec<_>>>()?
                .join(", ")
        ),
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => format!(
                "MAP<{}, {}>",
                type_ddl(kv[0].data_type())?,
                type_ddl(kv[1].data_type())?
            ),
            _ => return None,
        },
        _ => return None,
    })
}

fn tokenize(s: &str) -> Result<Vec<String>, String> {
    let mut out = vec![];
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '`' {
            chars.next();
            let mut name = String::from("`");
            loop {
                match chars.next() {
                    Some('`') if chars.peek() == Some(&'`') => {
                        chars.next();
                        name.push('`');
                    }
                    Some('`') => break,
                    Some(c) => name.push(c),
                    None => return Err("a quoted name is not closed".into()),
                }
            }
            out.push(name);
        } else if c.is_alphanumeric() || c == '_' {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_alphanumeric() || c == '_' {
                    word.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(word);
        } else if "<>(),:".contains(c) {
            out.push(c.to_string());
            chars.next();
        } else {
            return Err(format!("unexpected character '{c}'"));
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<String>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(String::as_str)
    }

    fn next(&mut self) -> Result<String, String> {
        let t = self
            .tokens
            .get(self.pos)
            .cloned()
            .ok_or_else(|| "it ends too early".to_string())?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, t: &str) -> Result<(), String> {
        match self.next()? {
            got if got == t => Ok(()),
            got => Err(format!("expected '{t}' but found '{got}'")),
        }
    }

    fn keyword(&mut self, k: &str) -> bool {
        if self.peek().is_some_and(|t| t.eq_ignore_ascii_case(k)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Fields up to the end, or up to `close` (for a struct), separated by commas.
    fn fields(&mut self, close: Option<&str>) -> Result<Vec<Field>, String> {
        let mut fields = vec![];
        loop {
            if self.peek().is_none() || self.peek() == close {
                return Ok(fields);
            }
            let name = self.next()?;
            let name = match name.strip_prefix('`') {
                Some(quoted) => quoted.to_string(),
                None if name.chars().all(|c| c.is_alphanumeric() || c == '_') => name,
                None => return Err(format!("expected a column name but found '{name}'")),
            };
            if close.is_some() {
                self.keyword(":");
            }
            let data_type = self.data_type()?;
            let nullable = !(self.keyword("NOT") && {
                if !self.keyword("NULL") {
                    return Err("NOT must be followed by NULL".into());
                }
                true
            });
            fields.push(Field::new(name, data_type, nullable));
            if !self.keyword(",") {
                return Ok(fields);
            }
        }
    }

    fn data_type(&mut self) -> Result<DataType, String> {
        let name = self.next()?.to_ascii_uppercase();
        Ok(match name.as_str() {
            "BOOLEAN" | "BOOL" => DataType::Boolean,
            "TINYINT" | "BYTE" => DataType::Int8,
            "SMALLINT" | "SHORT" => DataType::Int16,
            "INT" | "INTEGER" => DataType::Int32,
            "BIGINT" | "LONG" => DataType::Int64,
            "FLOAT" | "REAL" => DataType::Float32,
            "DOUBLE" => DataType::Float64,
            "STRING" | "TEXT" => DataType::Utf8,
            "VARCHAR" | "CHAR" => {
                if self.keyword("(") {
                    self.next()?;
                    self.expect(")")?;
                }
                DataType::Utf8
            }
            "BINARY" => DataType::Binary,
            "DATE" => DataType::Date32,
            "TIMESTAMP" | "TIMESTAMP_LTZ" => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
            "TIMESTAMP_NTZ" => DataType::Timestamp(TimeUnit::Microsecond, None),
            "DECIMAL" | "DEC" | "NUMERIC" => {
                let (mut p, mut s) = (10u8, 0i8);
                if self.keyword("(") {
                    p = self.number()?;
                    if self.keyword(",") {
                        s = i8::try_from(self.number()?)
                            .map_err(|_| "the decimal scale is too large".to_string())?;
                    }
                    self.expect(")")?;
                }
                if p == 0 || p > 38 || s < 0 || s as u8 > p {
                    return Err(format!(
                        "DECIMAL({p},{s}) is out of range (precision 1 to 38)"
                    ));
                }
                DataType::Decimal128(p, s)
            }
            "ARRAY" => {
                self.expect("<")?;
                let item = self.data_type()?;
                self.expect(">")?;
                DataType::List(Arc::new(Field::new_list_field(item, true)))
            }
            "MAP" => {
                self.expect("<")?;
                let k = self.data_type()?;
                self.expect(",")?;
                let v = self.data_type()?;
                self.expect(">")?;
                DataType::Map(
                    Arc::new(Field::new(
                        "entries",
                        DataType::Struct(Fields::from(vec![
                            Field::new("key", k, false),
                            Field::new("value", v, true),
                        ])),
                        false,
                    )),
                    false,
                )
            }
            "STRUCT" => {
                self.expect("<")?;
                let fields = self.fields(Some(">"))?;
                self.expect(">")?;
                DataType::Struct(Fields::from(fields))
            }
            other => return Err(format!("unknown type '{other}'")),
        })
    }

    fn number(&mut self) -> Result<u8, String> {
        let t = self.next()?;
        t.parse()
            .map_err(|_| format!("expected a number but found '{t}'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_round_trips_through_every_supported_type() {
        let ddl = "id BIGINT NOT NULL, name STRING, ok BOOLEAN, i INT, s SMALLINT, t TINYINT, \
                   f FLOAT, d DOUBLE, b BINARY, day DATE, at TIMESTAMP, ntz TIMESTAMP_NTZ, \
                   price DECIMAL(12,2), tags ARRAY<STRING>, m MAP<STRING, BIGINT>, \
                   `odd name` STRUCT<x: INT, y: ARRAY<DOUBLE>>";
        let schema = parse_ddl(ddl).unwrap();
        assert_eq!(schema.fields().len(), 16);
        assert!(!schema.field(0).is_nullable());
        assert_eq!(schema.field(12).data_type(), &DataType::Decimal128(12, 2));
        let text = to_ddl(&schema).unwrap();
        assert_eq!(parse_ddl(&text).unwrap(), schema, "{text}");
    }

    #[test]
    fn bad_ddl_is_refused_with_what_is_wrong() {
        for (ddl, says) in [
            ("a BIGINT, a STRING", "appears twice"),
            ("a VARCHAR2", "unknown type 'VARCHAR2'"),
            ("a ARRAY<INT", "ends too early"),
            ("a INT b INT", "unexpected 'b'"),
            ("", "names no column"),
            ("a DECIMAL(50,2)", "out of range"),
        ] {
            let err = parse_ddl(ddl).unwrap_err();
            assert_eq!(err.class, "INVALID_SCHEMA");
            assert!(err.to_string().contains(says), "{ddl}: {err}");
        }
    }
}
