from django.core.management.base import BaseCommand

from approvals.services.approvals import approvals_expire


class Command(BaseCommand):
    help = "Mark approval requests past their expiry EXPIRED (a timeout never approves anything)."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=500)

    def handle(self, *args, batch_size, **options):
        self.stdout.write(f"expired {approvals_expire(batch_size=batch_size)} approval request(s)")
