"""The demo's webhook receiver (only with DEBUG, i.e. `bin/run`): the downstream the demo's
outbox intents are relayed to. It deduplicates by `Idempotency-Key` and answers the relay's
reconciliation check. Never enabled in production settings: it accepts unauthenticated POSTs."""

import json

from django.db.models import F
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from demo.models import Delivery

MAX_BODY = 64 * 1024


@csrf_exempt
@require_POST
def hook(request: HttpRequest) -> HttpResponse:
    key = request.headers.get("Idempotency-Key", "")
    if not key or len(key) > 140 or "\x00" in key or len(request.body) > MAX_BODY:
        return JsonResponse({"error": "an Idempotency-Key and a body under 64 KB"}, status=400)
    try:
        body = json.loads(request.body or b"null")
    except ValueError:
        return JsonResponse({"error": "not JSON"}, status=400)
    delivery, created = Delivery.objects.get_or_create(key=key, defaults={"body": body})
    if not created:
        Delivery.objects.filter(pk=delivery.pk).update(repeats=F("repeats") + 1)
    return JsonResponse({"key": key, "verdict": "performed" if created else "deduplicated"})


@require_GET
def check(request: HttpRequest) -> HttpResponse:
    key = request.GET.get("key", "")
    found = Delivery.objects.filter(key=key[:140]).exists()
    return JsonResponse({"key": key[:140], "found": found}, status=200 if found else 404)
