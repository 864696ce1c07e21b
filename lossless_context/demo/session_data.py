"""Template data for the deterministic session generators in `sessions.py`: the fictional
repository's files, error and symptom phrasings, chat topics and canary vocabularies."""

from __future__ import annotations

def _t(s: str) -> tuple[str, ...]:
    return tuple(s.split("|"))


# The fictional repo: src/<path>.py -> (docstring, class, table, fields, functions).
_TREE = {f"src/{p}.py": (doc, cls, table, tuple(fields.split()), tuple(fns.split())) for p, doc, cls, table, fields, fns
         in (ln.split("|") for ln in """\
billing/invoice|Invoice assembly and finalisation.|Invoice|invoices|customer_id currency subtotal line_items issued_at|\
build_invoice apply_discounts finalize_invoice render_line_items
billing/tax|Tax computation per jurisdiction.|TaxRule|tax_rules|jurisdiction rate amount exempt_reason updated_at|\
compute_tax resolve_jurisdiction round_tax
billing/discounts|Discount codes and stacking rules.|Discount|discounts|code percent_off amount customer_id expires_at|\
eligible_discounts stack_discounts validate_code
ledger/entries|Double-entry ledger postings.|LedgerEntry|ledger_entries|account_id amount currency reference posted_at|\
post_entry reverse_entry balance_for
ledger/reconcile|Daily reconciliation of payouts against the ledger.|ReconcileReport|reconcile_runs|\
run_date expected_total actual_total mismatches finished_at|reconcile_day match_payouts flag_drift
payments/gateway|Thin wrapper around the card processor API.|PaymentIntent|payment_intents|\
intent_id amount currency status captured_at|charge refund capture_intent
api/webhooks|Inbound webhook verification and dispatch.|WebhookEvent|webhook_events|\
event_id event_type payload attempts received_at|verify_signature dispatch_event enqueue_retry
api/routes|HTTP routes for invoices.|InvoiceView|invoices|invoice_id customer_id status total created_at|\
create_invoice get_invoice list_invoices
workers/retry|Retry policy with exponential backoff.|RetryPolicy|retry_state|\
max_attempts base_delay attempts last_error next_run_at|next_delay should_retry run_with_retries
workers/scheduler|Cron-like scheduler for background jobs.|Job|scheduled_jobs|job_id name cron status last_run_at|\
schedule_job due_jobs mark_done
common/config|Settings loaded from config/ and the environment.|Settings|settings|\
database_url region retry_limit metrics_port loaded_at|load_settings get_setting""".splitlines())}
_PATHS = list(_TREE)
_BODY = (
    'if not $x.$f:\n    raise ValueError("$f is required")',
    'total = Decimal("0")\nfor item in $x.$g or []:\n    total += Decimal(str(item.get("amount", 0)))',
    'log.info("$fn: id=%s $f=%s", $x.$f, $x.$g)', "result = $o($x, strict=strict)\nif result is None:\n    return None",
    'with transaction() as tx:\n    tx.execute(\n        "UPDATE $t SET $f = %s WHERE id = %s",\n'
    "        ($x.$f, id($x)),\n    )",
    'for attempt in range($C):\n    if $o($x):\n        break\n    log.warning("$fn attempt %d failed", attempt + 1)',
    'if strict and $x.$f != $x.$g:\n    raise ${cls}Error("$f mismatch for %r" % ($x,))',
    "cached = _CACHE.get(id($x))\nif cached is not None:\n    return cached", "$x.$f = $x.$f or settings.default_$f",
    'payload = {"$f": str($x.$f), "$g": str($x.$g)}\nlog.debug("$fn payload=%s", payload)')
_CASES = _t("happy_path|empty_input|rounding|multi_currency|idempotent|retry_exhausted|negative_amount|large_batch|"
            "missing_field|eu_customer")
_ERRORS = _t("AssertionError: assert Decimal('$a') == Decimal('$b')|KeyError: '$f'|"
             "TypeError: $fn() got an unexpected keyword argument '$f'|"
             "AttributeError: '$cls' object has no attribute '${f}_total'|ValueError: $f must be positive, got -$a|"
             'psycopg.errors.UniqueViolation: duplicate key value violates unique constraint "${t}_pkey"|'
             "ZeroDivisionError: division by zero")
_SYMPTOMS = _t("returns the wrong total|raises a KeyError|double-counts refunds|times out|ignores the currency|"
               "drops the last line item|rounds half-cent amounts down")
_CONDITIONS = _t("an invoice has more than one discount|the customer is in the EU|a webhook is retried|"
                 "the batch is empty|the amount is negative|two workers run at once")
_FEATURES = _t("support for partial refunds|a --dry-run flag|idempotency keys|per-tenant rate limits|CSV export|"
               "structured logging|a configurable retry budget|soft deletes")
_AUTHORS = _t("Dana Reyes|Tom Becker|Priya Nair|Luis Ortega|Mei Chen|Sam Patel|Jonas Berg")
_EXPLORE = _t("Let me look at $fn and its tests first.|Searching for the call sites of $fn.|"
              "I'll read $path and the related tests before changing anything.|")
_FIX = _t("The failure is in $fn: the $f branch never handles the empty case. Patching it.|"
          "Found it - $fn uses $f before it is normalised. Fixing that and tightening the test.|"
          "Applying the fix to $path.|")
_FACTS = ("Context for this session: the repo is acme-ledger on Python 3.11, tests run with `pytest -q` (or "
          "`make test`), and staging Postgres is at postgres://ledger@staging-db:5432/ledger. ")
_LATER = _t("Use the same test command I gave you at the start.|Same repo conventions as before.|"
            "Remember the staging DB from earlier; don't touch it.||")
_REASONS = _t("normalise before use|guard against None|see review|keep in sync with tests")
_TOGGLES = (("strict=strict", "strict=True"), ("strict=True", "strict=strict"), (" or []", ""), ("== ", "!= "),
            ("!= ", "== "), ("log.info(", "log.debug("), ("log.debug(", "log.info("))
_SVC = _t("ledger|invoice|payout|tax|webhook|refund|notify|audit|export|billing")
_SVC2 = _t("sync|api|worker|relay|gateway|scheduler|indexer|exporter")
_TABLES = _t("ledger_entries|invoice_lines|payouts|refunds|tax_rates|audit_events|webhook_events")
_JOBS = _t("reconcile_nightly|export_tax|close_books|sync_payouts|rebuild_balances|purge_webhooks")
_TEAMS = _t("finance|platform|payments|compliance|data|support|security|infra")
_AREAS = _t("tax export|payout matching|dunning emails|ledger close|webhook signing|invoice PDFs|currency conversion|"
            "refund approvals|audit trail|rate limiter")
_THINGS = _t("retry limit|rate-limit table|tax rounding rules|backoff schedule|feature flags|currency whitelist|"
             "batch size|timeout budget")
_BUGS = _t("flaky webhook retries|duplicate payout rows|stale tax rates|slow invoice listing|missing audit events|"
           "timezone drift in reports|leaking DB connections")
_LEVELS = ("INFO ",) * 12 + ("DEBUG",) * 5 + ("WARN ",) * 2 + ("ERROR",)
_EVENTS = _t("processed batch|flushed cursor|retrying request|slow query|lock wait|heartbeat")
# Canary-only vocabulary: ordinary text never uses these words, so canary values stay unique.
_C_FIRST = _t("Ottilie|Bartholomew|Genevieve|Ignatius|Rosalind|Thaddeus|Wilhelmina|Cornelius|Philippa|Evander|"
              "Marisol|Leopold|Seraphina|Casimir|Henrietta|Ambrose|Lucinda|Percival|Clementine|Barnaby|Imogen")
_C_LAST = _t("Okonkwo|Ashworth|Lindqvist|Pemberton|Zielinski|Achterberg|Castellano|Featherstone|Nakashima|"
             "Oyelaran|Quist|Raffensperger|Szabo|Thistlewood|Underhill|Varga|Wexley|Yarborough|Kowalczyk|Halloran")
_C_DIRS = _t("deploy/limits|etc/policies|conf.d/tuning|settings/pinned|ops/runtime|infra/knobs")
_C_WORDS = _t("backoff|ceiling|quota|budget|window|throttle|cutoff|guard|drift|cap")
_C_ERR = (_t("LEDGER|QUOTA|SHARD|TOKEN|PAYOUT|SCHEMA|CACHE|BATCH|CURSOR"),
          _t("DRIFT|OVERFLOW|MISMATCH|TIMEOUT|STALE|ORPHAN|LOCKED|SKEW|GAP"))
_C_TICKET = _t("QX|ZK|VW|JQ|XV|QZ")
_C_PASS = _t("quokka|marzipan|zeppelin|tamarind|obsidian|kumquat|narwhal|gossamer|periwinkle|sassafras|wombat")
_C_KINDS = {"coding": _t("number_in_tool_output|path_in_decision|error_string|name_said_once|ticket_id"),
            "chat": _t("name_said_once|number_in_chat|ticket_id|passphrase_in_chat")}
_C_KINDS["mixed"] = _C_KINDS["coding"] + ("number_in_chat", "passphrase_in_chat")
_SLOT = {"number_in_tool_output": "tool", "error_string": "tool", "path_in_decision": "assistant"}  # else "user"
_C_CTX = {"number_in_tool_output": "coding", "error_string": "coding", "path_in_decision": "coding",
          "number_in_chat": "chat", "passphrase_in_chat": "chat"}  # others fit either context

# Chat topics: "=== name" then "key: a|b|c" lines; keys other than open/follow/say are slots kept per topic.
_TOPIC_SPEC = """\
=== travel
city: Lisbon|Kyoto|Oaxaca|Edinburgh|Ljubljana|Hanoi
month: April|May|June|September|October
open: I'm planning {days} days in {city} in {month}. Can you sketch an itinerary that isn't too rushed?|\
What's the easiest way from the airport into central {city}? Is a transit pass worth it?
follow: Could you swap day {k} for something more outdoorsy?|Where would you stay in {city} on about ${money} a \
night?|Any food in {city} I shouldn't miss?|Is {month} too rainy for day trips?
say: Big museums are best first thing in the morning; queues build by late morning.|A multi-day transit pass \
usually pays for itself after about six rides.|Keep one afternoon unplanned - it is usually the part of a trip \
people remember.|Book the most popular restaurant a couple of weeks ahead and keep lunches flexible.|Day trips by \
train are easy; check the return times so you are not stranded.|Staying near the old town costs more but saves a \
lot of transit time.
=== recipes
dish: shakshuka|mushroom risotto|chana masala|lemon tart|pho|focaccia
open: Can you give me a reliable recipe for {dish} for {k} people?|My {dish} always comes out bland. What am I \
doing wrong?
follow: Can I make the {dish} a day ahead?|What could I substitute for the cream?|How do I scale the {dish} for \
{k} people?|Which wine or drink goes with {dish}?
say: Salt in stages rather than all at the end; taste after each addition.|Toast the spices in oil for a minute \
before adding anything wet.|Acidity at the end - lemon or a splash of vinegar - wakes the flavours up.|Most of \
the prep can be done the day before; finish and season just before serving.|Use a wide pan so the liquid reduces \
evenly instead of stewing.|Rest the dough longer than you think; an overnight rise in the fridge adds flavour.
=== books
book: The Salt Orchard|A Map of Quiet Rivers|Nine Lanterns|The Glass Meridian
open: I just finished {book}. What did you make of the ending?|Our book club is reading {book} next. Can you \
give me discussion questions?
follow: Do you think the narrator of {book} is reliable?|What should I read after {book}?|Why does the middle \
section of {book} drag for so many readers?
say: The ending is deliberately open; it asks you to decide whether the return home is a defeat.|The unreliable \
narration is signposted early, in the way dates keep shifting.|A good discussion question: which character \
changes least, and why does that matter?|The slow middle mirrors the stalled grief of the protagonist, which is \
easier to see on a reread.|If you liked the structure, look for other novels told in braided timelines.
=== taxes
topic: home office deduction|quarterly estimated payments|capital gains on index funds|freelance income
open: I started freelancing this year. How should I handle {topic}?|Can you explain how {topic} works in plain \
terms?
follow: What records should I keep for the {topic}?|Is there a deadline I should put in my calendar?|What \
happens if I underpaid by about ${money}?
say: Keep receipts and a simple log; most disputes come down to documentation.|Estimated payments are usually \
due four times a year; missing one mostly costs interest.|Only the part of the home used regularly and \
exclusively for work normally qualifies.|Long-term gains are taxed more lightly than short-term ones in many \
systems.|This is general information, not tax advice; a local accountant can confirm the details.
=== fitness
goal: a first 10k run|getting back to pull-ups|a stronger back|a half marathon
open: I want to train for {goal}. Can you draft a {k}-week plan?|How many days a week should I train for {goal}?
follow: My knees ache after long runs. Should I change anything?|Can I add a rest day in week {k}?|What should \
I eat before a morning session?
say: Increase weekly volume by roughly ten percent at most.|Keep most sessions easy; one harder day a week is \
plenty at the start.|Sleep and a rest day do more for progress than an extra workout.|Strength work twice a week \
protects knees and hips.|A small carb snack an hour before training is enough for most people.
=== garden
plant: tomatoes|basil|a fig tree|lavender|blueberries
open: What's the best way to grow {plant} on a small balcony?|My {plant} leaves are turning yellow. Any idea why?
follow: How often should I water the {plant} in summer?|Do {plant} need a bigger pot?|Which fertiliser would \
you use for {plant}?
say: Yellow lower leaves usually mean overwatering or a lack of nitrogen.|Water deeply and less often so roots \
grow down instead of staying at the surface.|Most fruiting plants want six or more hours of direct sun.|A pot \
with drainage holes matters more than the brand of compost.|Mulch keeps the soil temperature even and cuts \
watering in half."""
_TOPICS = {block.split("\n", 1)[0]: {k: _t(v) for k, v in (ln.split(": ", 1) for ln in block.split("\n")[1:])}
           for block in _TOPIC_SPEC[4:].split("\n=== ")}
_TOPIC_NAMES = list(_TOPICS)
_MONTHS = _TOPICS["travel"]["month"]
_INTROS = _t("Good question.|Sure - a few thoughts.|Here's how I'd approach it.|Happy to help.|")
_CLOSERS = _t("Want me to turn this into a checklist?|Shall I go into more detail on any of these?||Let me know how "
              "it goes.")
_ASK = _t("Before we wrap up: {q}|{q}|Quick check on something from much earlier: {q}|"
          "One more thing: {q} I need the exact value.")
