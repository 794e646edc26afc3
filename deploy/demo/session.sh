# shellcheck shell=bash disable=SC2154 # cli is the caller's
# The scripted session both demos run (make demo, make demo-rxe), and the
# rkv-client wrapper it uses. Sourced; the caller defines `cli` (an array:
# the rkv-client command with its connection flags) and `fail NODE MESSAGE`.

# run_cli WANT ARGS...: print the command, run it, fail unless it exits WANT.
run_cli() {
	local want=$1
	shift
	echo "\$ rkv-client $*"
	local rc=0
	"${cli[@]}" "$@" || rc=$?
	[[ $rc -eq $want ]] || fail "" "rkv-client $* exited $rc, want $want"
	if [[ $want -ne 0 ]]; then echo "(exit status $rc)"; fi
}

# demo_session: put (also from stdin), get, members, owner, scan, del, the
# deleted key's not-found exit, status.
demo_session() {
	run_cli 0 put user:1 alice
	run_cli 0 put user:2 bob
	run_cli 0 put user:3 carol
	run_cli 0 put city:paris France
	echo "\$ echo -n 'from stdin' | rkv-client put note"
	echo -n 'from stdin' | "${cli[@]}" put note || fail "" "put from stdin failed"
	local k
	for k in user:1 user:2 user:3 city:paris note; do
		echo "\$ rkv-client get $k"
		"${cli[@]}" get "$k" || fail "" "get $k failed"
		echo
	done
	run_cli 0 members
	run_cli 0 map
	for k in user:1 user:2 user:3; do run_cli 0 owner "$k"; done
	# Into this transcript (a pipe) scan prints its rows alone, KEY<TAB>VALUE;
	# on a terminal it adds a header and the count.
	run_cli 0 scan --prefix user: --values
	run_cli 0 scan --keys-only
	run_cli 0 del user:2
	run_cli 1 get user:2
	run_cli 0 status
}
