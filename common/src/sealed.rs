//! Checksummed text files: a last line `#fnv64=<hex>` over everything before it, so that
//! damage inside a value of a human-readable log file (which still parses) is found. Files
//! written before the line existed read as they are.

const CHECKSUM: &str = "\n#fnv64=";

fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The checksum [`seal`] writes, as 16 hex digits: for files that must stay one JSON object
/// and so carry it in a field.
pub fn checksum(text: &str) -> String {
    format!("{:016x}", fnv64(text.as_bytes()))
}

/// `text` with a last line checksumming it.
pub fn seal(text: String) -> String {
    let sum = fnv64(text.as_bytes());
    format!("{text}{CHECKSUM}{sum:016x}")
}

/// The text of a [`seal`]ed file, checked; a file without a checksum line is taken as it is.
/// The error completes "the file ...".
pub fn unseal(text: &str) -> Result<&str, String> {
    let Some((body, sum)) = text.rsplit_once(CHECKSUM) else {
        return Ok(text);
    };
    match u64::from_str_radix(sum.trim_end(), 16) {
        Ok(s) if s == fnv64(body.as_bytes()) => Ok(body),
        _ => Err("is damaged (its checksum does not match its content)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_text_reads_back_and_damage_is_found() {
        let sealed = seal("v1\n{\"a\":\"b\"}".into());
        assert_eq!(unseal(&sealed).unwrap(), "v1\n{\"a\":\"b\"}");
        assert!(unseal(&sealed.replace("\"b\"", "\"c\"")).is_err());
        assert_eq!(unseal("v1\nold").unwrap(), "v1\nold");
    }
}
