"""terminal_bench_2_1's resources server (NeMo Gym 0.7.0) whose `/verify` first ends what the
agent's rollout left running in its container, then runs NeMo Gym's own verify unchanged.

Why: NeMo Gym's terminal_bench_2_1 grades in the agent's own container ("Re-use the original
sandbox"): it uploads the task's tests, runs `bash /tests/test.sh` there and takes
`float(/logs/verifier/reward.txt)` as the reward. A process the model started in the background
(the children of a `docker exec` outlive it, reparented to the container's init) could rewrite
that file after the tests, and its number would be the reward. Before the tests start, this
server ends every process of the container but its init (PID 1), the keepalive NeMo Gym's docker
provider started as the container's command (init's first child) and the keepalive's own
children (its `sleep`); it stops them all first (SIGSTOP), then kills them (SIGKILL), in rounds
until none is left, so a process forking as it dies is caught. A container where that cannot be
done, or proven, fails `/verify` (the rollout is an error), never a reward.

What this costs: a service the agent started and the tests would query is gone too (a task
whose tests need a running server the agent set up then fails). NeMo Gym's golden-patch mode
(`is_verifying_golden_patch`: a fresh container, the reference solution) is left as it is.

Only for the docker provider (`containers.sandbox.shadow_servers` runs this file as the server's
`app.py` from the stack's folder, in NeMo Gym's server venv: it imports nothing of
verifiers_nemogym): a docker container is its own PID namespace, and a `docker exec` process's
parent is outside it (its PPid reads 0). The script checks that before it ends anything, so on
a sandbox sharing the host's processes it ends nothing and `/verify` fails.
"""

from fastapi import Request
from nemo_gym.server_utils import SESSION_ID_KEY
from resources_servers.terminal_bench_2_1.app import (
    TerminalBench21ResourcesServer,
    TerminalBench21VerifyRequest,
    TerminalBench21VerifyResponse,
)

END_LEFTOVERS = r"""
# Builtins only (read, set, kill, case): this shell forks nothing but `sleep` between rounds.
read -r st 2>/dev/null < /proc/$$/stat || { echo "cannot read /proc" >&2; exit 3; }
st=${st##*) }; set -- $st
if [ "$2" != 0 ]; then
    echo "not the container's own PID namespace (this exec's parent is PID $2)" >&2; exit 3
fi
keep= best=
for d in /proc/[0-9]*; do
    read -r st 2>/dev/null < "$d/stat" || continue
    st=${st##*) }; set -- $st
    # Field 4 is the parent, field 22 the start time: the keepalive is init's first child.
    if [ "$2" = 1 ] && [ "$1" != Z ] && { [ -z "$best" ] || [ "${20}" -lt "$best" ]; }; then
        keep=${d#/proc/} best=${20}
    fi
done
rounds=0
while :; do
    found=
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        case $p in 1|$$|$keep) continue ;; esac
        read -r st 2>/dev/null < "$d/stat" || continue
        st=${st##*) }; set -- $st
        case $1 in Z|X|x) continue ;; esac
        if [ -n "$keep" ] && [ "$2" = "$keep" ]; then continue; fi
        if [ "$2" = $$ ]; then continue; fi
        kill -STOP "$p" 2>/dev/null && found="$found $p"
    done
    [ -z "$found" ] && break
    kill -KILL $found 2>/dev/null
    rounds=$((rounds + 1))
    if [ "$rounds" -ge 100 ]; then
        echo "processes left by the rollout kept running:$found" >&2; exit 4
    fi
    sleep 0.1 2>/dev/null || sleep 1
done
echo "ended the rollout's leftover processes in $rounds round(s); kept 1 and ${keep:-none}"
"""
"""POSIX sh run as root in the agent's container (see the module doc); exit 0 once no process
but init, the keepalive and its children is left."""


class GuardedTerminalBench21ResourcesServer(TerminalBench21ResourcesServer):
    """NeMo Gym's server, its `/verify` preceded by `END_LEFTOVERS` in the agent's container."""

    async def verify(
        self, request: Request, body: TerminalBench21VerifyRequest
    ) -> TerminalBench21VerifyResponse:
        if not self.config.is_verifying_golden_patch:
            session = request.session[SESSION_ID_KEY]
            sandbox = self._session_id_to_sandbox.get(session)
            if sandbox is not None:
                result = await sandbox.exec(END_LEFTOVERS, user="root", timeout_s=120)
                if result.return_code != 0 or result.error_type is not None:
                    self._session_id_to_sandbox.pop(session, None)
                    await sandbox.stop()
                    raise RuntimeError(
                        "the rollout's leftover processes could not be ended before the tests "
                        f"(exit {result.return_code}, {result.error_type}): "
                        f"{(result.stderr or '').strip()[-500:]}"
                    )
        return await super().verify(request, body)


if __name__ == "__main__":
    GuardedTerminalBench21ResourcesServer.run_webserver()
