"""The checks of the Python module's test scripts (test_borrow.py, test_borrow_cuda.py): check()
prints each result and keeps the failures; refused() runs f and says whether it raised m3mono.Error
with every needle in its message (any other outcome is a failure of the contract)."""
import m3mono

fails = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        fails.append(what)


def refused(f, *needles):
    try:
        f()
    except m3mono.Error as e:
        msg = str(e)
        return all(n in msg for n in needles), msg
    except Exception as e:  # noqa: BLE001 - any other exception breaks the contract
        return False, f"{type(e).__name__}: {e}"
    return False, "accepted"
