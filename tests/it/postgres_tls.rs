//! TLS to Postgres: a throwaway cluster that refuses plain TCP, with a certificate from a throwaway CA.
//! `sslmode=verify-full` with that CA as `sslrootcert` serves (and the session is encrypted); the same mode
//! with another CA, or `sslmode=disable`, fails at start with the reason.

use crate::common;

use std::{path::Path, process::Command};

use common::{BUNDLE, TestApp, b64, fixture_image, pg::PgCluster};
use jointspace::app::Application;
use jointspace::config::ServeArgs;
use serde_json::json;

/// Runs `openssl` with `args` (split on spaces: none of them holds one) in `dir`.
fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args.split(' '))
        .output()
        .expect("openssl (Debian: apt-get install openssl; the postgresql package depends on it)");
    assert!(
        out.status.success(),
        "openssl {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

/// A CA (`{name}.pem`, `{name}.key`) valid for a day.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &format!(
            "req -x509 {EC_KEY} -keyout {name}.key -out {name}.pem -days 1 -subj /CN={name} \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    );
}

/// A server certificate for localhost and 127.0.0.1 (`server.pem`, `server.key`), signed by the CA `ca`.
fn make_server_cert(dir: &Path, ca: &str) {
    openssl(
        dir,
        &format!("req {EC_KEY} -keyout server.key -out server.csr -subj /CN=localhost"),
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    openssl(
        dir,
        &format!(
            "x509 -req -in server.csr -CA {ca}.pem -CAkey {ca}.key -CAcreateserial -out server.pem -days 1 \
             -extfile server.ext"
        ),
    );
}

async fn start_fails(url: &str) -> String {
    let cfg = ServeArgs::try_from_flags(vec![
        "--addr",
        "127.0.0.1:0",
        "--bundle",
        BUNDLE,
        "--database-url",
        url,
        "--database-timeout",
        "3",
    ])
    .expect("flags");
    match Application::build(cfg).await {
        Ok(_) => panic!("started on {url}"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_against_the_clusters_ca_serves_and_anything_weaker_or_wrong_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path();
    make_ca(certs, "ca");
    make_ca(certs, "other-ca");
    make_server_cert(certs, "ca");
    let pg = PgCluster::start();
    let plain = pg.create_db("tls").await;
    pg.require_tls(&certs.join("server.pem"), &certs.join("server.key"));
    let with = |mode: &str, ca: &str| {
        format!(
            "{}?sslmode={mode}&sslrootcert={}",
            plain.replace("127.0.0.1", "localhost"),
            certs.join(format!("{ca}.pem")).display()
        )
    };

    let url = with("verify-full", "ca");
    let app = TestApp::start_url(BUNDLE, &url, &[]).await;
    app.create_collection("c").await;
    let (s, body) = app
        .post_json(
            "/v1/collections/c/images",
            json!({"images": [{"data": b64(&fixture_image(2)), "external_id": "two"}]}),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    let (s, hits) = app
        .post_json(
            "/v1/collections/c/images/search",
            json!({"image": b64(&fixture_image(2)), "k": 1}),
        )
        .await;
    assert_eq!(s, 200, "{hits}");
    assert_eq!(hits["results"][0]["image"]["external_id"], "two");
    app.stop().await;
    // The session the server's driver opens with this URL is encrypted.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.expect("connect");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pg_stat_ssl");
    assert!(ssl);
    pool.close().await;

    // A certificate from a CA the client does not trust: no connection, and the error says why.
    let e = start_fails(&with("verify-full", "other-ca")).await;
    assert!(
        e.contains("TLS handshake") && e.contains("UnknownIssuer") && e.contains("sslrootcert"),
        "{e}"
    );
    assert!(!e.contains("retry shortly"), "{e}");
    // Without TLS the cluster refuses the connection.
    let e = start_fails(&format!("{plain}?sslmode=disable")).await;
    assert!(
        e.contains("no encryption") || e.contains("pg_hba.conf"),
        "{e}"
    );
}
