"""Work a client controls, run where a crash or a stall is contained: child processes of the
router, never its event loop.

A client's grammar is compiled by native code that recurses along the grammar's chains of
references (a few thousand links overflow the stack: SIGSEGV), and a request's own chat
template is a program (nested loops run for as long as they like). In the router either one
would end or freeze every stream and /health. So:

  frames.py  length-prefixed MessagePack frames between the router and a child (no pickle:
             what a child sends back is data, whatever ran in it)
  pool.py    ContainedPool: a few children, started on first use; a job waits for a free one
             (up to a bound, then overload), runs under a time limit, and a child that dies or
             passes the limit is killed and replaced; the event loop only awaits
  child.py   the child process (`python -m router.contained.child`): compiles grammars and
             builds their matchers as a worker will, on a thread with a small stack, and
             renders chat templates in the sandbox, within a memory bound

router/http/contained.py turns each outcome into the HTTP answer (400, 429 or 503).
"""
