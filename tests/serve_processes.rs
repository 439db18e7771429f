//! Several processes sharing one store through its server (`docs/ARCHITECTURE.md`, "Several
//! processes"), with real processes and SIGKILL: four client processes racing for one run's
//! lease hold it one at a time with growing tokens; a client killed inside a leased atom keeps
//! the run until its lease expires, and its atom is executed again by the next holder, once;
//! a client whose lease was taken over gets `StaleLease` and records nothing; a killed server
//! leaves its clients `Disconnected`, and a new server of the store serves every atom
//! acknowledged before the kill. Guards against two processes both running a run's steps, a
//! dead client's half-done atom landing, and a server that acknowledges what it loses.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use continuum::serve::{Client, SOCKET_FILE_NAME};
use continuum::shared_state::StateValue;
use continuum::{AtomFailure, AtomOutput, AtomStatus, Error, Lease, RunSpec, Store};

const ROLE_ENV: &str = "CONTINUUM_SERVE_ROLE";
const SOCKET_ENV: &str = "CONTINUUM_SERVE_SOCKET";
const DIR_ENV: &str = "CONTINUUM_SERVE_DIR";
const ARG_ENV: &str = "CONTINUUM_SERVE_ARG";
const LONG: Duration = Duration::from_secs(60);
const RACERS: usize = 4;
const RACES_EACH: usize = 250;

fn output(text: &str) -> AtomOutput {
    AtomOutput { result: text.as_bytes().to_vec(), ..AtomOutput::default() }
}

fn now_us() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970");
    u64::try_from(since.as_micros()).expect("microseconds fit")
}

/// Waits (without asserting on time) until `expires_at_unix_us` has passed by the wall clock.
fn wait_until(expires_at_unix_us: u64) {
    while now_us() <= expires_at_unix_us {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts this test binary as a child in `role`.
fn spawn(role: &str, envs: &[(&str, &str)], stdin: bool) -> (Child, BufReader<ChildStdout>) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command.args(["--exact", "serve_child", "--nocapture", "--test-threads=1"]).env(ROLE_ENV, role);
    for (name, value) in envs {
        command.env(name, value);
    }
    let stdin = if stdin { Stdio::piped() } else { Stdio::null() };
    let mut child = command.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn");
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    (child, stdout)
}

/// The fields after `prefix` of the child's first line starting with it.
fn line_of(stdout: &mut BufReader<ChildStdout>, prefix: &str) -> Vec<String> {
    let line = stdout.lines().map_while(Result::ok).find(|line| line.starts_with(prefix));
    let line = line.unwrap_or_else(|| panic!("the child printed no {prefix} line"));
    line.split(' ').skip(1).map(str::to_owned).collect()
}

fn kill(mut child: Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
}

/// The children: one role each, chosen by the parent through the environment.
#[test]
fn serve_child() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    let socket = std::env::var(SOCKET_ENV).unwrap_or_default();
    let arg = std::env::var(ARG_ENV).unwrap_or_default();
    match role.as_str() {
        "racer" => racer(&socket, &arg, &std::env::var(DIR_ENV).expect("log path")),
        "killed-holder" => killed_holder(&socket),
        "stale-holder" => stale_holder(&socket),
        "server" => server(&std::env::var(DIR_ENV).expect("store dir")),
        other => panic!("unknown role {other}"),
    }
}

/// Races for the run's lease `RACES_EACH` times, logging each hold's enter and leave with its
/// token (one `O_APPEND` write each), and executing one leased atom per hold.
fn racer(socket: &str, id: &str, log: &str) {
    let mut client = Client::connect(socket).expect("connect");
    let run = client.run_id("contended").expect("run_id").expect("the parent created it");
    let mut log = std::fs::OpenOptions::new().append(true).create(true).open(log).expect("log");
    let mut held = 0;
    while held < RACES_EACH {
        let lease = match client.acquire_lease(run, id, LONG) {
            Ok(lease) => lease,
            Err(Error::LeaseHeld { .. }) => {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(error) => panic!("acquire: {error}"),
        };
        log.write_all(format!("enter {id} {}\n", lease.token).as_bytes()).expect("log enter");
        let key = format!("{id}-{held}");
        client
            .execute_leased(&lease, "racer", &key, &[], |exchange| {
                exchange.add("holds", 1)?;
                Ok(output(&lease.token.to_string()))
            })
            .expect("leased atom");
        log.write_all(format!("leave {id} {}\n", lease.token).as_bytes()).expect("log leave");
        client.release_lease(lease).expect("release");
        held += 1;
    }
}

/// Takes a short lease, begins a leased atom, writes state in it, reports, and waits inside
/// it to be killed.
fn killed_holder(socket: &str) {
    let mut client = Client::connect(socket).expect("connect");
    let run = client.run_id("handed-over").expect("run_id").expect("the parent created it");
    let lease = client.acquire_lease(run, "doomed", Duration::from_secs(3)).expect("lease");
    let _ = client.execute_leased(&lease, "agent", "step", &[], |exchange| {
        exchange.put("half-done", b"by the killed client".to_vec())?;
        exchange.add("completions", 1)?;
        // On a line of its own: the test harness prints the test's name before its output.
        println!("\nBEGUN {} {} {}", lease.token, lease.expires_at_unix_us, exchange.atom().get());
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
}

/// Takes a short lease, begins a leased atom, and completes it when the parent says so (after
/// taking the run over); reports how the completion was refused.
fn stale_holder(socket: &str) {
    let mut client = Client::connect(socket).expect("connect");
    let run = client.run_id("taken-over").expect("run_id").expect("the parent created it");
    let lease = client.acquire_lease(run, "slow", Duration::from_millis(300)).expect("lease");
    let outcome = client.execute_leased(&lease, "agent", "step", &[], |exchange| {
        println!("\nBEGUN {} {} {}", lease.token, lease.expires_at_unix_us, exchange.atom().get());
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).expect("the parent's go");
        exchange.put("written", b"by the stale client".to_vec())?;
        Ok(output("stale"))
    });
    match outcome {
        Err(Error::OutputNotRecorded { source, .. }) if matches!(*source, Error::StaleLease { .. }) => {
            println!("\nRESULT stale-lease");
        }
        other => println!("\nRESULT other {other:?}"),
    }
}

/// Opens the store, serves it on its default socket, reports, and waits to be killed.
fn server(dir: &str) {
    let store = Arc::new(Store::open(dir).expect("server open"));
    let _server = store.serve(None).expect("serve");
    println!("\nSERVING");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn four_client_processes_racing_for_one_lease_hold_it_one_at_a_time_with_growing_tokens() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path().join("store")).expect("open"));
    let run = store.create_run(RunSpec::new("contended")).expect("run");
    let server = store.serve(None).expect("serve");
    let socket = server.path().to_str().expect("UTF-8 path").to_owned();
    let log = dir.path().join("holds.log");
    let log_path = log.to_str().expect("UTF-8 path");
    let racers: Vec<_> = (0..RACERS)
        .map(|id| {
            let id = format!("racer-{id}");
            let envs = [(SOCKET_ENV, socket.as_str()), (ARG_ENV, id.as_str()), (DIR_ENV, log_path)];
            spawn("racer", &envs, false)
        })
        .collect();
    for (mut racer, stdout) in racers {
        // Read to the end, so that the racer's output never meets a closed pipe.
        stdout.lines().map_while(Result::ok).for_each(drop);
        assert!(racer.wait().expect("wait").success(), "a racer failed");
    }
    let lines = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<Vec<&str>> = lines.lines().map(|line| line.split(' ').collect()).collect();
    assert_eq!(lines.len(), 2 * RACERS * RACES_EACH, "every hold entered and left");
    let mut last_token = 0;
    for pair in lines.chunks(2) {
        let (enter, leave) = (&pair[0], &pair[1]);
        assert_eq!((enter[0], leave[0]), ("enter", "leave"), "one holder at a time: {pair:?}");
        assert_eq!((enter[1], enter[2]), (leave[1], leave[2]), "the holder that entered leaves first");
        let token: u64 = enter[2].parse().expect("token");
        assert!(token > last_token, "tokens grow strictly: {token} after {last_token}");
        last_token = token;
    }
    for id in 0..RACERS {
        let held = lines.iter().filter(|line| line[0] == "enter" && line[1] == format!("racer-{id}")).count();
        assert_eq!(held, RACES_EACH);
    }
    let holds = store.read_state(run, "holds").expect("read").expect("written");
    assert_eq!(holds.value, StateValue::Counter((RACERS * RACES_EACH) as i64), "every hold's atom completed");
    server.stop();
}

#[test]
fn a_client_killed_inside_a_leased_atom_leaves_it_to_the_next_holder_once_its_lease_expires() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let run = store.create_run(RunSpec::new("handed-over")).expect("run");
    let server = store.serve(None).expect("serve");
    let socket = server.path().to_str().expect("UTF-8 path").to_owned();
    let (child, mut stdout) = spawn("killed-holder", &[(SOCKET_ENV, socket.as_str())], false);
    let fields: Vec<u64> = line_of(&mut stdout, "BEGUN ").iter().map(|field| field.parse().expect("number")).collect();
    kill(child);
    let (token, expires_at_unix_us, atom) = (fields[0], fields[1], continuum::AtomId::from_raw(fields[2]));

    let mut client = Client::connect(&socket).expect("connect");
    if now_us() < expires_at_unix_us {
        match client.acquire_lease(run, "successor", LONG) {
            Err(Error::LeaseHeld { holder, token: held, .. }) => assert_eq!((holder.as_str(), held), ("doomed", token)),
            // The clock passed the expiry between the check and the call.
            other => assert!(now_us() >= expires_at_unix_us, "{other:?}"),
        }
    }
    wait_until(expires_at_unix_us);
    let lease = client.acquire_lease(run, "successor", LONG).expect("the lease passed on");
    assert!(lease.token > token, "{} after {token}", lease.token);
    assert_eq!(store.read_state(run, "half-done").expect("read"), None, "nothing of the killed atom landed");
    let mut ran = 0;
    let done = client
        .execute_leased(&lease, "agent", "step", &[], |exchange| {
            ran += 1;
            exchange.add("completions", 1)?;
            Ok(output("successor"))
        })
        .expect("executed again");
    assert_eq!((ran, done.executed.atom, done.executed.replayed), (1, atom, false), "the work ran, in the same atom");
    let recorded = store.atom(atom).expect("atom");
    assert_eq!((recorded.status, recorded.output), (AtomStatus::Completed, Some(output("successor"))));
    let completions = store.read_state(run, "completions").expect("read").expect("written");
    assert_eq!(completions.value, StateValue::Counter(1), "the key's work completed once");
    assert_eq!(store.read_state(run, "half-done").expect("read"), None);
    server.stop();
}

#[test]
fn a_client_whose_lease_was_taken_over_gets_stale_lease_and_records_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(Store::open(dir.path()).expect("open"));
    let run = store.create_run(RunSpec::new("taken-over")).expect("run");
    let server = store.serve(None).expect("serve");
    let socket = server.path().to_str().expect("UTF-8 path").to_owned();
    let (mut child, mut stdout) = spawn("stale-holder", &[(SOCKET_ENV, socket.as_str())], true);
    let fields: Vec<u64> = line_of(&mut stdout, "BEGUN ").iter().map(|field| field.parse().expect("number")).collect();
    let (token, expires_at_unix_us, atom) = (fields[0], fields[1], continuum::AtomId::from_raw(fields[2]));
    wait_until(expires_at_unix_us);
    let mut client = Client::connect(&socket).expect("connect");
    let lease = client.acquire_lease(run, "new-holder", LONG).expect("taken over");
    assert!(lease.token > token);
    writeln!(child.stdin.as_mut().expect("piped stdin"), "go").expect("go");
    assert_eq!(line_of(&mut stdout, "RESULT "), ["stale-lease"], "the stale completion is refused across the socket");
    assert!(child.wait().expect("wait").success());
    let stale = store.atom(atom).expect("atom");
    assert_eq!((stale.status, stale.output), (AtomStatus::Running, None), "nothing of its end is recorded");
    assert_eq!(store.read_state(run, "written").expect("read"), None);
    let done = client.execute_leased(&lease, "agent", "step", &[], |_| Ok(output("new"))).expect("the new holder");
    assert_eq!(done.executed.atom, atom);
    server.stop();
}

#[test]
fn a_killed_server_disconnects_its_clients_and_a_new_one_serves_every_acknowledged_atom() {
    const ATOMS: usize = 20;
    let dir = tempfile::tempdir().expect("dir");
    let dir_path = dir.path().to_str().expect("UTF-8 path");
    let socket = dir.path().join(SOCKET_FILE_NAME);
    let (mut server, mut stdout) = spawn("server", &[(DIR_ENV, dir_path)], false);
    line_of(&mut stdout, "SERVING");
    let mut client = Client::connect(&socket).expect("connect");
    let run = client.create_run(RunSpec::new("served")).expect("run");
    let lease = client.acquire_lease(run, "worker", LONG).expect("lease");
    let mut acknowledged = Vec::new();
    for step in 0..ATOMS {
        let text = format!("step {step}");
        let done = client
            .execute_leased(&lease, "agent", &format!("step-{step}"), &[], |exchange| {
                exchange.add("acknowledged", 1)?;
                Ok(output(&text))
            })
            .expect("acknowledged");
        acknowledged.push((done.executed.atom, text));
    }
    let inside = client.execute_leased(&lease, "agent", "doomed", &[], |exchange| {
        server.kill().expect("SIGKILL the server");
        server.wait().expect("reap");
        let refused = exchange.add("acknowledged", 1);
        assert!(matches!(refused, Err(Error::Disconnected { .. })), "{refused:?}");
        Err(AtomFailure::from(refused.expect_err("refused")))
    });
    assert!(matches!(inside, Err(Error::Disconnected { .. })), "{inside:?}");
    assert!(matches!(client.lease_of(run), Err(Error::Disconnected { .. })));
    assert!(matches!(client.run_id("served"), Err(Error::Disconnected { .. })));

    let (server, mut stdout) = spawn("server", &[(DIR_ENV, dir_path)], false);
    line_of(&mut stdout, "SERVING");
    let mut client = Client::connect(&socket).expect("reconnect to the new server");
    for (atom, text) in &acknowledged {
        let recorded = client.atom(*atom).expect("atom");
        assert_eq!((recorded.status, recorded.output), (AtomStatus::Completed, Some(output(text))));
    }
    let count = client.read_state(run, "acknowledged").expect("read").expect("written");
    assert_eq!(count.value, StateValue::Counter(ATOMS as i64), "nothing of the atom in flight landed");
    let renewed: Lease = client.renew_lease(&lease, LONG).expect("the lease and its token survived");
    assert_eq!(renewed.token, lease.token);
    drop(client);
    kill(server);
    assert!(Path::new(&socket).exists(), "a killed server leaves its socket file for the next to replace");
}
