//! URL ingest's one job: an image's bytes from an http(s) URL a caller gave, without letting the caller reach
//! what only the server can (loopback, private networks, cloud metadata). Every address is checked after DNS
//! resolution, for every connection, redirects included (the client's resolver refuses forbidden addresses);
//! hosts written as IP addresses, which no resolver sees, are checked directly, on every hop. Each fetch is
//! bounded in time, bytes and redirects, and the fetches in flight per server by a semaphore.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    str::FromStr,
    sync::Arc,
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use reqwest::{
    Url,
    dns::{Addrs, Name, Resolve, Resolving},
    header::{ACCEPT, CONTENT_TYPE},
    redirect,
};

/// Redirects followed before a fetch is refused.
pub const MAX_REDIRECTS: usize = 3;

/// An address range of the allow-list: `10.1.0.0/16`, `fd00::/8`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    len: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (s, None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| {
            format!(
                "{s:?} is not an address range; write one as 10.1.0.0/16, fd00::/8 or 192.0.2.7"
            )
        })?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        // Host bits are ignored: 127.0.0.1/8 is 127.0.0.0/8.
        Ok(Cidr {
            net: masked(canonical(ip), len),
            len,
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.net.is_ipv4() && masked(ip, self.len) == self.net
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are the IPv4 address they carry: the same socket.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn masked(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// Why a URL may not reach an address, or `None` for a public one.
pub fn forbidden_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(a) => forbidden_v4(a),
        IpAddr::V6(a) => forbidden_v6(a),
    }
}

fn in_v4(a: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let m = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(a) & m == u32::from(Ipv4Addr::from(net)) & m
}

fn forbidden_v4(a: Ipv4Addr) -> Option<&'static str> {
    let ranges: [([u8; 4], u32, &'static str); 12] = [
        ([0, 0, 0, 0], 8, "an unspecified (\"this network\") address"),
        ([127, 0, 0, 0], 8, "a loopback address"),
        ([10, 0, 0, 0], 8, "a private address (RFC 1918)"),
        ([172, 16, 0, 0], 12, "a private address (RFC 1918)"),
        ([192, 168, 0, 0], 16, "a private address (RFC 1918)"),
        ([169, 254, 169, 254], 32, "the cloud metadata address"),
        ([169, 254, 0, 0], 16, "a link-local address"),
        ([100, 64, 0, 0], 10, "a shared (carrier-grade NAT) address"),
        ([192, 0, 0, 0], 24, "an IETF protocol address"),
        ([198, 18, 0, 0], 15, "a benchmarking address"),
        ([224, 0, 0, 0], 4, "a multicast address"),
        ([240, 0, 0, 0], 4, "a reserved or broadcast address"),
    ];
    ranges
        .iter()
        .find(|(net, len, _)| in_v4(a, *net, *len))
        .map(|(_, _, why)| *why)
}

fn forbidden_v6(a: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(a);
    let seg = a.segments();
    // IPv6 forms that carry an IPv4 address reach that address: judge it.
    let embedded = |v: u128| Ipv4Addr::from((v & 0xffff_ffff) as u32);
    if a.is_unspecified() {
        return Some("an unspecified address");
    }
    if a.is_loopback() {
        return Some("a loopback address");
    }
    if let Some(v4) = a.to_ipv4_mapped() {
        return forbidden_v4(v4);
    }
    if bits >> 32 == 0 {
        // IPv4-compatible (::a.b.c.d), deprecated but still routed by some stacks.
        return forbidden_v4(embedded(bits));
    }
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        // NAT64 (64:ff9b::/96).
        return forbidden_v4(embedded(bits));
    }
    if seg[0] == 0x2002 {
        // 6to4: the IPv4 address is in bits 16..48.
        return forbidden_v4(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    match seg[0] {
        s if s & 0xfe00 == 0xfc00 => Some("a unique local (private) address"),
        s if s & 0xffc0 == 0xfe80 => Some("a link-local address"),
        s if s & 0xffc0 == 0xfec0 => Some("a site-local address"),
        s if s & 0xff00 == 0xff00 => Some("a multicast address"),
        _ => None,
    }
}

/// An address a URL may not reach, and why.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The name that resolved to it (none for a URL that names the address itself).
    pub host: Option<String>,
    /// The redirect that led to it, when it was not the URL given.
    pub redirect: Option<String>,
    pub ip: IpAddr,
    pub reason: &'static str,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(to) = &self.redirect {
            write!(f, "a redirect to {to}: ")?;
        }
        match &self.host {
            Some(h) => write!(f, "{h} resolves to {}, {}", self.ip, self.reason),
            None => write!(f, "{} is {}", self.ip, self.reason),
        }
    }
}

impl std::error::Error for Refused {}

/// The forbidden ranges, less what the operator allowed.
#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    allow: Vec<Cidr>,
}

impl AddressGuard {
    pub fn new(allow: Vec<Cidr>) -> AddressGuard {
        AddressGuard { allow }
    }

    pub fn check(&self, host: Option<&str>, ip: IpAddr) -> Result<(), Refused> {
        match forbidden_reason(ip) {
            Some(reason) if !self.allow.iter().any(|c| c.contains(ip)) => Err(Refused {
                host: host.map(str::to_string),
                redirect: None,
                ip,
                reason,
            }),
            _ => Ok(()),
        }
    }

    /// A URL before it is requested (the first one, and each redirect's): http or https, with a host; an
    /// address written in it is checked here, since no resolver sees it.
    pub fn check_url(&self, url: &Url) -> Result<(), FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::InvalidUrl(format!(
                "the scheme is {:?}; only http and https are fetched",
                url.scheme()
            )));
        }
        let host = match url.host_str() {
            None | Some("") => return Err(FetchError::InvalidUrl("the URL has no host".into())),
            Some(h) => h,
        };
        // The parser has already normalised every IPv4 spelling (0x7f.1, 2130706433) to dotted decimal.
        match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => self.check(None, ip).map_err(FetchError::Forbidden),
            Err(_) => Ok(()),
        }
    }
}

/// The client's resolver: the system's answer, less the forbidden addresses. A name with nothing else is
/// refused, so the connection is never attempted.
struct GuardedResolver {
    guard: Arc<AddressGuard>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (guard, host) = (self.guard.clone(), name.as_str().to_string());
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match guard.check(Some(&host), a.ip()) {
                    Ok(()) => true,
                    Err(r) => {
                        refused.get_or_insert(r);
                        false
                    }
                })
                .collect();
            match (allowed.is_empty(), refused) {
                (true, Some(r)) => Err(Box::new(FetchError::Forbidden(r)) as _),
                (true, None) => Err(format!("{host} has no address").into()),
                (false, _) => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

/// Why an image could not be fetched. Facts only: the API adds what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("URL ingest is off on this server")]
    Off,
    #[error("not a usable URL: {0}")]
    InvalidUrl(String),
    #[error("refused: {0}")]
    Forbidden(Refused),
    #[error("could not fetch it: {0}")]
    Unreachable(String),
    #[error("no complete answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("the server answered {0}")]
    Status(reqwest::StatusCode),
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
    #[error("the response is over the limit of {max} bytes{}", .declared.map(|d| format!(" (it declares {d})")).unwrap_or_default())]
    TooLarge { max: usize, declared: Option<u64> },
    #[error("the response is {content_type:?}, not an image")]
    NotImage { content_type: String },
    #[error("the response is {content_type:?}, not a feed (CSV or JSON lines)")]
    NotFeed { content_type: String },
}

impl FetchError {
    /// A short stable name: the metric's outcome label.
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::Off => "off",
            FetchError::InvalidUrl(_) => "invalid_url",
            FetchError::Forbidden(_) => "forbidden",
            FetchError::Unreachable(_) => "unreachable",
            FetchError::Timeout(_) => "timeout",
            FetchError::Status(_) => "status",
            FetchError::TooManyRedirects => "redirects",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::NotImage { .. } => "not_image",
            FetchError::NotFeed { .. } => "not_feed",
        }
    }

    /// A client error, with what the guard or the redirect policy refused found in its causes.
    fn from_client(e: reqwest::Error, timeout: Duration) -> FetchError {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let mut chain = Vec::new();
        while let Some(c) = cause {
            if let Some(f) = c.downcast_ref::<FetchError>() {
                return match f {
                    FetchError::Forbidden(r) => FetchError::Forbidden(r.clone()),
                    FetchError::InvalidUrl(m) => FetchError::InvalidUrl(m.clone()),
                    _ => FetchError::TooManyRedirects,
                };
            }
            // reqwest's own text repeats the URL, which the caller already has.
            if !std::ptr::addr_eq(c, &e) {
                chain.push(c.to_string());
            }
            cause = c.source();
        }
        if e.is_timeout() {
            return FetchError::Timeout(timeout);
        }
        chain.dedup();
        FetchError::Unreachable(if chain.is_empty() {
            e.to_string()
        } else {
            chain.join(": ")
        })
    }
}

#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The whole fetch: connecting, redirects and the body.
    pub timeout: Duration,
    pub max_bytes: usize,
    /// Fetches in flight at once in this server; the others wait their turn.
    pub max_in_flight: usize,
    /// Ranges taken out of the forbidden ones.
    pub allow: Vec<Cidr>,
}

pub struct Fetcher {
    client: reqwest::Client,
    guard: Arc<AddressGuard>,
    opts: FetchOptions,
    permits: tokio::sync::Semaphore,
}

impl Fetcher {
    pub fn new(opts: FetchOptions) -> Result<Fetcher, reqwest::Error> {
        let guard = Arc::new(AddressGuard::new(opts.allow.clone()));
        let hop_guard = guard.clone();
        let policy = redirect::Policy::custom(move |attempt| {
            // `previous` holds the URLs already requested: one per redirect followed so far, plus this one's.
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(FetchError::TooManyRedirects);
            }
            match hop_guard.check_url(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(FetchError::Forbidden(mut r)) => {
                    r.redirect = Some(redacted(attempt.url().as_str()));
                    attempt.error(FetchError::Forbidden(r))
                }
                Err(e) => attempt.error(e),
            }
        });
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(GuardedResolver {
                guard: guard.clone(),
            }))
            .redirect(policy)
            // A proxy would make the connections the guard never sees.
            .no_proxy()
            .connect_timeout(opts.timeout)
            .user_agent(concat!(
                "jointspace/",
                env!("CARGO_PKG_VERSION"),
                " (URL ingest)"
            ))
            .build()?;
        Ok(Fetcher {
            client,
            guard,
            permits: tokio::sync::Semaphore::new(opts.max_in_flight.max(1)),
            opts,
        })
    }

    pub fn options(&self) -> &FetchOptions {
        &self.opts
    }

    /// The image at `url`: an http(s) URL whose every hop reaches only allowed addresses, answering 2xx with
    /// an image (or untyped bytes, which decoding then judges) within the time and byte limits.
    pub async fn fetch(&self, url: &str) -> Result<Bytes, FetchError> {
        self.fetch_as(url, Wanted::Image).await
    }

    /// A catalogue feed (CSV or JSON lines) at `url`, under the same guard and time limit as an image and at
    /// most `max_bytes`: any type but an HTML page (a login or error page read as a feed would fail every line).
    pub async fn fetch_feed(&self, url: &str, max_bytes: usize) -> Result<Bytes, FetchError> {
        self.fetch_as(url, Wanted::Feed { max_bytes }).await
    }

    async fn fetch_as(&self, url: &str, wanted: Wanted) -> Result<Bytes, FetchError> {
        let url = Url::parse(url.trim()).map_err(|e| FetchError::InvalidUrl(e.to_string()))?;
        self.guard.check_url(&url)?;
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| FetchError::Unreachable("the server is shutting down".into()))?;
        tokio::time::timeout(self.opts.timeout, self.get(url, wanted))
            .await
            .unwrap_or(Err(FetchError::Timeout(self.opts.timeout)))
    }

    async fn get(&self, url: Url, wanted: Wanted) -> Result<Bytes, FetchError> {
        let client_error = |e| FetchError::from_client(e, self.opts.timeout);
        let accept = match wanted {
            Wanted::Image => "image/*",
            Wanted::Feed { .. } => "text/csv, application/x-ndjson, application/jsonl, */*;q=0.5",
        };
        let mut r = self
            .client
            .get(url)
            .header(ACCEPT, accept)
            .send()
            .await
            .map_err(client_error)?;
        if !r.status().is_success() {
            return Err(FetchError::Status(r.status()));
        }
        let content_type = r
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase());
        // Object stores often serve images untyped; those are judged by decoding. Anything typed as something
        // else (an HTML error page, JSON) is refused before its body is read.
        if let Some(ct) = content_type {
            let fits = match wanted {
                Wanted::Image => {
                    ct.starts_with("image/") || ct.starts_with("application/octet-stream")
                }
                Wanted::Feed { .. } => !ct.starts_with("text/html"),
            };
            if !fits {
                return Err(match wanted {
                    Wanted::Image => FetchError::NotImage { content_type: ct },
                    Wanted::Feed { .. } => FetchError::NotFeed { content_type: ct },
                });
            }
        }
        let max = match wanted {
            Wanted::Image => self.opts.max_bytes,
            Wanted::Feed { max_bytes } => max_bytes,
        };
        if let Some(n) = r.content_length() {
            if n > max as u64 {
                return Err(FetchError::TooLarge {
                    max,
                    declared: Some(n),
                });
            }
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = r.chunk().await.map_err(client_error)? {
            if body.len() + chunk.len() > max {
                return Err(FetchError::TooLarge {
                    max,
                    declared: None,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }
}

/// What a fetch is for: its Accept header, the types it takes and its byte limit.
#[derive(Debug, Clone, Copy)]
enum Wanted {
    Image,
    Feed { max_bytes: usize },
}

/// A URL fit for a log line: a password in it (`https://user:secret@host/...`) replaced by `***`.
pub fn redacted(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_password_in_a_url_is_not_repeated() {
        assert_eq!(
            redacted("https://shop:s3cret@img.example.com/a.jpg?x=1"),
            "https://shop:***@img.example.com/a.jpg?x=1"
        );
        let plain = "https://img.example.com/a.jpg";
        assert_eq!(redacted(plain), plain);
        assert_eq!(redacted("not a url"), "not a url");
    }

    #[test]
    fn loopback_private_link_local_metadata_and_their_ipv6_forms_are_forbidden() {
        for a in [
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.1.2.3",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
        ] {
            assert!(forbidden_reason(ip(a)).is_some(), "{a} should be forbidden");
        }
        assert_eq!(
            forbidden_reason(ip("169.254.169.254")),
            Some("the cloud metadata address")
        );
        assert_eq!(
            forbidden_reason(ip("::ffff:127.0.0.1")),
            Some("a loopback address")
        );
    }

    #[test]
    fn public_addresses_are_allowed() {
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "169.253.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::",
        ] {
            assert_eq!(forbidden_reason(ip(a)), None, "{a} should be allowed");
        }
    }

    #[test]
    fn cidrs_parse_mask_and_match_ipv4_mapped_forms() {
        let c: Cidr = "127.0.0.1/8".parse().expect("cidr");
        assert_eq!(c.to_string(), "127.0.0.0/8");
        assert!(c.contains(ip("127.3.2.1")));
        assert!(c.contains(ip("::ffff:127.0.0.1")));
        assert!(!c.contains(ip("128.0.0.1")));
        assert!(!c.contains(ip("::1")));
        let one: Cidr = "10.1.2.3".parse().expect("one address");
        assert!(one.contains(ip("10.1.2.3")) && !one.contains(ip("10.1.2.4")));
        let v6: Cidr = "fd00::/8".parse().expect("v6");
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().expect("all");
        assert!(all.contains(ip("10.0.0.1")) && !all.contains(ip("fd00::1")));
        for bad in [
            "",
            "10.0.0.0/33",
            "fd00::/129",
            "10.0.0/8",
            "ten/8",
            "10.0.0.0/x",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn the_allow_list_lifts_only_its_ranges() {
        let g = AddressGuard::new(vec!["127.0.0.0/8".parse().expect("cidr")]);
        assert!(g.check(None, ip("127.0.0.1")).is_ok());
        assert!(g.check(None, ip("8.8.8.8")).is_ok());
        let r = g
            .check(Some("localhost"), ip("::1"))
            .expect_err("::1 is not in the list");
        assert_eq!(
            r.to_string(),
            "localhost resolves to ::1, a loopback address"
        );
        let e = g.check(None, ip("169.254.169.254")).expect_err("metadata");
        assert_eq!(
            e.to_string(),
            "169.254.169.254 is the cloud metadata address"
        );
    }

    #[test]
    fn urls_need_http_a_host_and_an_allowed_literal_address() {
        let g = AddressGuard::default();
        let check = |u: &str| g.check_url(&Url::parse(u).expect("url"));
        assert!(check("https://example.com/a.jpg").is_ok());
        assert!(check("http://93.184.216.34/a.jpg").is_ok());
        assert!(matches!(
            check("ftp://example.com/a.jpg"),
            Err(FetchError::InvalidUrl(_))
        ));
        assert!(matches!(
            check("file:///etc/passwd"),
            Err(FetchError::InvalidUrl(_))
        ));
        for u in [
            "http://127.0.0.1:8080/",
            "http://[::1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
            "http://[::ffff:7f00:1]/",
            "http://0x7f.1/",
            "http://2130706433/",
        ] {
            assert!(matches!(check(u), Err(FetchError::Forbidden(_))), "{u}");
        }
    }
}
