//! How values are written into the database's columns: vectors as little-endian f32 blobs, times as RFC 3339
//! UTC text (second precision; no date crate needed for this one format).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn vector_to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn blob_to_vector(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// RFC 3339 UTC timestamp of now.
pub fn now_rfc3339() -> String {
    rfc3339_at(unix_now() as i64)
}

/// RFC 3339 UTC timestamp of `age` ago (for pruning by `created_at`, which sorts as text).
pub fn rfc3339_ago(age: Duration) -> String {
    rfc3339_at(unix_now().saturating_sub(age.as_secs()) as i64)
}

/// RFC 3339 UTC timestamp of a Unix time in seconds.
pub fn rfc3339_at(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_match_known_dates() {
        assert_eq!(rfc3339_at(0), "1970-01-01T00:00:00Z");
        // A leap day, and the last second of a century year that is a leap year.
        assert_eq!(rfc3339_at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_at(978_307_199), "2000-12-31T23:59:59Z");
        // 1900 is not a leap year: the day after Feb 28 is Mar 1.
        assert_eq!(rfc3339_at(-2_203_977_600), "1900-02-28T00:00:00Z");
        assert_eq!(rfc3339_at(-2_203_977_600 + 86_400), "1900-03-01T00:00:00Z");
        assert_eq!(rfc3339_at(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339_at(1_795_392_000), "2026-11-23T00:00:00Z");
    }

    #[test]
    fn timestamps_sort_as_text_in_time_order() {
        let times = [
            -86_400 * 400,
            -1,
            0,
            59,
            3_600,
            86_399,
            86_400,
            1_700_000_000,
        ];
        let texts: Vec<String> = times.iter().map(|&t| rfc3339_at(t)).collect();
        let mut sorted = texts.clone();
        sorted.sort();
        assert_eq!(texts, sorted);
        assert!(rfc3339_ago(Duration::from_secs(3600)) < now_rfc3339());
    }

    #[test]
    fn vectors_round_trip_bit_for_bit() {
        let v = [
            0.0f32,
            -0.0,
            1.5,
            -3.25e-7,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
        ];
        let blob = vector_to_blob(&v);
        assert_eq!(blob.len(), 4 * v.len());
        assert_eq!(&blob[8..12], &1.5f32.to_le_bytes());
        let back = blob_to_vector(&blob);
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // A torn trailing value is dropped, not read past the end.
        assert_eq!(blob_to_vector(&blob[..9]).len(), 2);
    }
}
