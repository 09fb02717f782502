#!/usr/bin/env python3
"""Generate a deterministic sample of customer-support messages for the Laneway demo.

Writes, next to this script:
  customer_messages.csv    header ``id,text`` (RFC 4180 quoting via the csv module)
  customer_messages.jsonl  one {"id": ..., "text": ...} object per line, same rows

Standard library only; a fixed seed makes the output byte-for-byte reproducible.
Messages are drawn roughly evenly from seven support categories (billing,
shipping, product quality, account/login, technical problem, praise,
cancellation/refund), but the category is deliberately NOT written out: the
model has to infer it.

Usage:  python3 examples/make_sample.py [--rows 1200] [--seed 20240611]
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSV_PATH = HERE / "customer_messages.csv"
JSONL_PATH = HERE / "customer_messages.jsonl"

DEFAULT_ROWS = 1200
DEFAULT_SEED = 20240611
MIN_WORDS, MAX_WORDS = 8, 60

# --------------------------------------------------------------------------
# Slot fillers
# --------------------------------------------------------------------------
GADGETS = [  # things with power / batteries / sound
    "bluetooth headset", "espresso machine", "air fryer", "LED desk lamp", "mechanical keyboard",
    "blender", "smart watch", "bluetooth speaker", "coffee grinder", "noise cancelling headset",
    "electric toothbrush", "robot vacuum", "USB-C hub", "gaming mouse", "portable charger",
    "webcam", "humidifier", "hair dryer", "e-reader", "kettle",
]
GARMENTS = [  # things with sizes / fabric / zips
    "winter jacket", "running vest", "hoodie", "rain poncho", "hiking backpack", "yoga top",
    "rain jacket", "wool sweater", "laptop sleeve", "duffel bag", "tote bag", "fleece vest",
]
HOMEWARE = [  # solid goods
    "standing desk", "yoga mat", "phone case", "cast iron skillet", "water bottle",
    "throw blanket", "ceramic mug set", "duvet cover", "knife set", "desk organizer",
    "office chair", "camping tent", "bookshelf", "kids bike helmet", "plant stand",
]
PRODUCTS = GADGETS + GARMENTS + HOMEWARE
FURNITURE = ["standing desk", "office chair", "bookshelf", "plant stand", "side table", "bar stool"]
PORTABLE = ["portable charger", "bluetooth speaker", "camping tent", "hiking backpack", "e-reader",
            "water bottle", "duffel bag", "laptop sleeve", "travel kettle"]
PHONES = ["iPhone 14", "iPhone 12", "Pixel 7", "Galaxy S23", "Moto G"]
COLORS = ["black", "navy", "white", "grey", "red", "olive", "sand", "pink", "blue", "charcoal"]
SIZES = ["S", "M", "L", "XL", "XS", "size 9", "size 10", "size 7.5", "size 11", "medium", "large"]
CARRIERS = ["UPS", "FedEx", "USPS", "DHL", "Royal Mail", "Canada Post", "OnTrac", "the courier"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
CITIES = ["Denver", "Austin", "Portland", "Leeds", "Toronto", "Chicago", "Phoenix",
          "Manchester", "Seattle", "Atlanta", "Dublin", "Melbourne", "Boston", "Tampa",
          "Calgary", "Glasgow", "San Diego", "Columbus"]
PLANS = ["Basic", "Pro", "Team", "Business", "Starter", "Premium", "Enterprise"]
FEATURES = [  # singular nouns; templates supply "the"
    "CSV export", "dashboard", "two-factor login", "mobile app", "calendar sync",
    "Slack integration", "invoice generator", "search bar", "bulk upload tool",
    "reporting page", "API", "workspace sharing", "Zapier connector", "notification center",
    "file preview", "analytics tab", "SSO login", "template editor", "auto-save feature",
    "kanban board", "PDF export", "recurring tasks feature", "time tracker", "client portal",
]
BROWSERS = ["Chrome", "Firefox", "Safari", "Edge", "Brave"]
DEVICES = ["iPhone 14", "Pixel 7", "Galaxy S23", "iPad", "MacBook", "Windows laptop",
           "Chromebook", "Android tablet", "work PC", "iPhone 12"]
ERROR_CODES = ["500", "502", "403", "ERR_TIMEOUT", "E1042", "0x80070005", "429", "AUTH-07",
               "SYNC_FAILED", "404", "E-2219", "503", "NET::ERR_CERT", "E-0031"]
ERROR_MSGS = ["Something went wrong", "Session expired", "Unable to process request",
              "Invalid token", "Oops! Please try again later", "Network error",
              "You do not have permission", "Payment method declined", "Upload failed"]
FIRST_NAMES = ["Maria", "James", "Priya", "Tom", "Aisha", "Kevin", "Lena", "Carlos", "Mei",
               "Daniel", "Fatima", "Olivia", "Raj", "Sophie", "Marcus", "Hannah", "Diego",
               "Yuki", "Ben", "Chloe", "Omar", "Grace", "Luca", "Nina", "Sean", "Ivy"]
LAST_NAMES = ["Garcia", "Smith", "Patel", "Nguyen", "Brown", "Kowalski", "Okafor", "Miller",
              "Rossi", "Chen", "Johnson", "Silva", "Murphy", "Khan", "Weber", "Lopez"]
EMAIL_DOMAINS = ["gmail.com", "yahoo.com", "outlook.com", "hotmail.com", "icloud.com",
                 "proton.me", "company.io", "mail.com"]
AGENTS = ["Sarah", "Mike", "Jess", "Alex", "Sam", "Dana", "Chris", "Emily", "Ryan", "Kim"]
APP_NAME = ["the app", "your app", "the web app", "the platform", "your software", "the site"]
SHIP_STATUSES = ["label created", "in transit", "out for delivery", "delayed",
                 "exception", "awaiting carrier pickup"]


def _money(rng: random.Random, lo: int = 5, hi: int = 400) -> str:
    cents = rng.choice([99, 99, 99, 95, 49, 0, 50, 89])
    return f"${rng.randint(lo, hi)}.{cents:02d}"


def _email(rng: random.Random) -> str:
    first = rng.choice(FIRST_NAMES).lower()
    last = rng.choice(LAST_NAMES).lower()
    local = rng.choice([f"{first}.{last}", f"{first}{last[0]}{rng.randint(1, 99)}",
                        f"{first[0]}{last}", f"{first}_{last}{rng.randint(70, 99)}"])
    return f"{local}@{rng.choice(EMAIL_DOMAINS)}"


def _date(rng: random.Random) -> str:
    m = rng.choice(MONTHS)
    d = rng.randint(1, 28)
    style = rng.randrange(3)
    if style == 0:
        return f"{m} {d}"
    if style == 1:
        return f"{MONTHS.index(m) + 1}/{d}"
    suffix = "th" if 10 <= d <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return f"the {d}{suffix}"


def make_slots(rng: random.Random) -> dict[str, str]:
    """A fresh set of slot values; a template uses whichever it needs."""
    first = rng.choice(FIRST_NAMES)
    product2, product = rng.sample(PRODUCTS, 2)
    plan2, plan = rng.sample(PLANS, 2)
    feature2, feature = rng.sample(FEATURES, 2)
    email, email2 = _email(rng), _email(rng)
    date, date2 = _date(rng), _date(rng)
    amount, amount2 = _money(rng), _money(rng, 5, 120)
    if float(amount[1:]) <= float(amount2[1:]):  # "{amount2} tax on a {amount} order" etc.
        amount, amount2 = amount2, amount
    return {
        "product2": product2, "plan2": plan2, "feature2": feature2,
        "email2": email2, "date2": date2,
        "product": product,
        "gadget": rng.choice(GADGETS),
        "garment": rng.choice(GARMENTS),
        "homeware": rng.choice(HOMEWARE),
        "color": rng.choice(COLORS),
        "size": rng.choice(SIZES),
        "order": rng.choice(["#", "#", "#", ""]) + str(rng.randint(100000, 999999)),
        "amount": amount,
        "amount2": amount2,
        "ship_fee": rng.choice(["$9.99", "$12.99", "$14.95", "$19.99", "$24.99", "$29.99"]),
        "big_amount": _money(rng, 300, 1500),
        "carrier": rng.choice(CARRIERS),
        "day": rng.choice(DAYS),
        "date": date,
        "n_days": str(rng.randint(3, 21)),
        "n_weeks": str(rng.randint(2, 6)),
        "n_times": rng.choice(["twice", "three times", "4 times", "5 times", "like 6 times"]),
        "seats": str(rng.choice([10, 12, 15, 20, 25, 30])),
        "few": rng.choice(["3", "4", "5", "6", "two", "three"]),
        "furniture": rng.choice(FURNITURE),
        "portable": rng.choice(PORTABLE),
        "phone": rng.choice(PHONES),
        "n_users": str(rng.choice([3, 5, 8, 12, 15, 20, 25, 40, 60])),
        "hours": str(rng.randint(2, 30)),
        "hour": f"{rng.randint(0, 23):02d}",
        "lost_hours": rng.choice(["two", "three", "four", "5", "6"]),
        "mb": str(rng.choice([20, 50, 100, 200, 250, 500])),
        "city": rng.choice(CITIES),
        "plan": plan,
        "feature": feature,
        "browser": rng.choice(BROWSERS),
        "device": rng.choice(DEVICES),
        "error": rng.choice(ERROR_CODES),
        "errmsg": rng.choice(ERROR_MSGS),
        "status": rng.choice(SHIP_STATUSES),
        "email": email,
        "agent": rng.choice(AGENTS),
        "last4": f"{rng.randint(0, 9999):04d}",
        "tracking": "1Z" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPRSTUVWXY") for _ in range(12)),
        "app": rng.choice(APP_NAME),
        "year": str(rng.choice([2, 3, 4, 5, 6])),
        "since": str(rng.randint(2015, 2022)),
        "stars": str(rng.choice([4, 5, 5, 5])),
        "pct": str(rng.choice([10, 15, 20, 25, 30])),
        "first": first,
        "first_full": f"{first} {rng.choice(LAST_NAMES)}",
        "first_init": f"{first} {rng.choice(LAST_NAMES)[0]}.",
    }


# --------------------------------------------------------------------------
# Templates: (tone, text). Tone picks compatible openers, closers and noise.
# --------------------------------------------------------------------------
P, N, A, H = "polite", "neutral", "angry", "happy"

TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "billing": [
        (A, "I was charged twice for order {order}. Two payments of {amount} on my card ending {last4}. Fix this now."),
        (P, "Could you please explain the {amount2} charge on my statement from {date}? I don't recognise it and I only have the {plan} plan."),
        (N, "my invoice for {date} says {amount} but the {plan} plan is supposed to be {amount2} a month. which one is right?"),
        (P, "I upgraded from {plan2} to {plan} mid-month and I think the proration is wrong. I was billed {amount} instead of roughly {amount2}."),
        (A, "Why did you charge me {amount} when I cancelled the trial on {date}?? This is basically stealing."),
        (N, "Need a VAT invoice for order {order} with our company name on it, the one in the account only shows my personal name."),
        (P, "My card ending in {last4} expired and I updated it, but the payment for {date} still failed. Can you retry it please?"),
        (N, "The promo code for {pct}% off didn't apply at checkout, I paid full price {amount} for the {product}. Can you refund the difference?"),
        (A, "Third month in a row I've been billed for {seats} seats when we only have {few} people using {app}. I want the overcharge back."),
        (N, "how do i change the billing email to {email}? invoices keep going to someone who left the company"),
        (P, "Is it possible to switch to annual billing on the {plan} plan? If so, would the {amount} I paid this month be credited?"),
        (A, "You billed my card {n_times} for the same {product}. Bank shows pending charges of {amount2} each. Sort it out."),
        (N, "Payment keeps getting declined with \"{errmsg}\" even though my bank says nothing is blocking it. Tried two different cards."),
        (P, "I think there's a currency issue. I was charged {amount} in USD but the page showed the price in euros. Could someone check?"),
        (N, "Sales tax on order {order} looks way too high, {amount2} tax on a {amount} order? I'm in {city}."),
        (A, "I never authorised an auto renewal. Just got hit with {big_amount} for a yearly {plan} plan. Refund it today."),
        (N, "Can I get a receipt for {order}? Need it for expenses."),
        (P, "Our finance team needs the invoices from {date} to {date2} as PDFs. Is there a way to download them all at once?"),
        (N, "Double charged again. {amount} twice on {date}."),
        (N, "What's this {amount2} charge labelled \"LNWY*SUBSCR\" on my card?"),
        (P, "I run the books for a small nonprofit and we were told we'd get a {pct}% discount on the {plan} plan when we signed up in {since}. The last three invoices were billed at the full {amount}, and I can't find the discount anywhere in the billing settings. Could you look into it and apply a credit for the difference?"),
        (A, "I have emailed about this charge {n_times} and nobody answers. {big_amount} was taken from our company card on {date} for seats we removed weeks ago. If this isn't reversed by {day} I'm filing a dispute and we're moving to a competitor."),
    ],
    "shipping": [
        (A, "Order {order} was supposed to arrive {day} and it's still not here. Tracking hasn't updated in {n_days} days. Where is my {product}?"),
        (N, "tracking number {tracking} says delivered but there's nothing at my door. checked with neighbours too"),
        (P, "I ordered a {product} on {date} and haven't received a shipping confirmation yet. Could you let me know when it will ship?"),
        (A, "{carrier} left my package in the rain and the {product} box is soaked through. Absolutely unacceptable."),
        (N, "Can I change the delivery address for order {order}? I'm moving to {city} next week and it hasn't shipped yet."),
        (P, "Do you ship to {city}? I'd like to order the {product} but the checkout won't accept my postcode."),
        (A, "Paid {ship_fee} for express shipping and it took {n_days} days. Express my foot. I want the shipping fee back."),
        (N, "My order {order} only had the {product}, the {product2} is missing. Packing slip lists both."),
        (N, "Package stuck in {city} since {day} according to {carrier}. Is it lost or just delayed?"),
        (P, "Would it be possible to hold my order until after {date}? I'm travelling and no one will be home to sign for it."),
        (A, "I've contacted you {n_times} now about order {order} and {carrier} says you never handed it over. Who is lying?"),
        (N, "got a delivery notice from {carrier} for a {product} i didnt order, order number {order}. think someone used my address?"),
        (P, "The estimated delivery for my {product} changed from {date} to {date2}. Is there any way to speed it up? It's a birthday gift."),
        (N, "Does the {product} ship in a plain box? It's a gift and I don't want the price showing."),
        (A, "Driver marked it as \"attempted delivery\" but I was home all day {day}. Nobody knocked. Now I have to drive to the depot."),
        (N, "how long does standard shipping take to {city}? site says {n_days} business days but my friend waited way longer"),
        (P, "My parcel {tracking} has been \"{status}\" for {n_weeks} weeks. Could you open a claim with {carrier} for me?"),
        (N, "Received order {order} today but the box was crushed and the {homeware} inside is dented. Should I send photos here?"),
        (N, "where is my order {order}?? been {n_days} days"),
        (N, "Has order {order} shipped yet? Still says processing."),
        (P, "I placed order {order} on {date} for my daughter's birthday, which is on {date2}. The tracking page has said \"{status}\" for almost a week now and {carrier} customer service told me they don't have the parcel. Could you check with your warehouse whether it actually left, and if not, send a replacement by express?"),
        (A, "This is the worst delivery experience I've ever had. The {product} was sent to the wrong address in {city}, {carrier} says it's your fault, you say it's theirs, and in the meantime I've paid {amount} for nothing. I want either the item or my money by {day}."),
    ],
    "quality": [
        (A, "The {gadget} stopped working after {n_days} days. Paid {amount} for something that feels like it came from a dollar store."),
        (N, "The {color} {garment} I got looks nothing like the photos, colour is way off and the material feels cheap."),
        (P, "The zipper on my {garment} broke the second time I used it. Is this covered under warranty?"),
        (N, "sizing is off, ordered {size} like always and the {garment} is way too small. is the chart wrong?"),
        (A, "Your {gadget} smells like burning plastic every time I turn it on. That's a safety hazard, I'm not using it again."),
        (P, "I love the design of the {gadget} but the battery only lasts about {hours} hours instead of the advertised amount. Is mine faulty?"),
        (N, "The {homeware} arrived cracked in one corner, order {order}. The outer box looked fine though."),
        (A, "Second {product} I've received with the same defect. Whoever does your quality control should be embarrassed."),
        (N, "The stitching on the {garment} is already coming apart after {n_weeks} weeks of normal use."),
        (P, "Could you tell me whether the {gadget} is supposed to make a rattling noise? Mine does when I move it and I'm worried something is loose."),
        (N, "The {portable} is a lot heavier and bulkier than the description says, not really portable at all."),
        (A, "Paint is peeling off the {color} {homeware} already. For {amount} I expected it to last more than a month."),
        (N, "left side of the {gadget} is noticeably louder than the right. tried resetting, didn't help"),
        (P, "The {gadget} works, but the instructions were missing from the box. Is there a PDF manual I could download?"),
        (A, "Cheap garbage. The handle snapped off the {homeware} on day one. Never buying from you again."),
        (N, "Colour faded after the first wash. It's the {color} {garment} in {size}, washed cold as the label says."),
        (P, "The {product} arrived with scratches on the surface. It still works, but for a gift I'd hoped for something in perfect condition."),
        (A, "So the \"waterproof\" {garment} leaks in light rain. Great. Really great."),
        (N, "{gadget} won't hold a charge anymore. bought it {n_weeks} weeks ago"),
        (N, "Is the {furniture} supposed to wobble like this? Feels unsafe."),
        (P, "I bought the {gadget} in {date} after reading a lot of good reviews, and for the first couple of weeks it was great. Since then it switches itself off randomly, sometimes {n_times} in an hour, even when fully charged. I've tried the reset steps from the manual. Is this a known issue, and can it be repaired or replaced?"),
        (A, "The {garment} I received is clearly a different quality from the one I bought last year. Thinner fabric, loose threads everywhere, and the {color} dye came off on my hands. For {amount} this is insulting, and I've been a loyal customer since {since}."),
    ],
    "account": [
        (A, "I can't log in. Password reset email never arrives, tried {n_times}. Checked spam. I need access to my account TODAY."),
        (N, "how do i change the email on my account from {email} to {email2}?"),
        (P, "I got locked out after too many login attempts. Could you unlock my account? It's registered under {email}."),
        (N, "Two-factor codes aren't arriving on my new phone, I switched from a {phone} and lost the authenticator."),
        (A, "Someone logged into my account from {city} and I've never been there. I want to know what they accessed, right now."),
        (P, "Could you merge my two accounts? I accidentally signed up with {email} and {email2} and my orders are split between them."),
        (N, "Sign in with Google keeps looping me back to the login page on {browser}."),
        (N, "Please delete my account and all my data. Email is {email}. I'd like confirmation when it's done."),
        (P, "I'm the admin for our {plan} workspace and I need to transfer ownership to a colleague, {email}. How do I do that?"),
        (A, "Your \"magic link\" login expires before the email even reaches me. Ridiculous. Just let me use a password."),
        (N, "added a new teammate but the invite to {email} says the link is invalid. resent it twice"),
        (N, "my username shows as someone else's name in the top corner after logging in, kinda worrying"),
        (P, "I forgot which email I used to sign up. My name is {first_full} and my last order was {order}. Can you help me find the account?"),
        (A, "Account suspended with no explanation and no warning. We're a paying {plan} customer. Reinstate it or call me."),
        (N, "Is there a way to turn off \"remember me\" on shared computers? we use {app} at the front desk"),
        (N, "SSO with our Okta setup stopped working this morning, error {error} for all {n_users} of our users."),
        (P, "I'd like to change the phone number on my account but the field is greyed out. Could you update it for me?"),
        (N, "login says \"{errmsg}\" every time. can't get in"),
        (N, "Forgot my password and the reset link is expired."),
        (P, "I changed jobs and no longer have access to my old work email, {email}, which is the login for my personal account. I still have my {device} logged in and I can confirm the last four digits of the card on file, {last4}. Is there any way to move the account over to {email2}?"),
        (A, "I set up two-factor like you recommended, then my phone died and now I'm completely locked out of an account I pay {amount2} a month for. The recovery form just says \"{errmsg}\" and your chat bot keeps sending me in circles. I need a human to fix this."),
    ],
    "technical": [
        (A, "The {feature} has been broken since {day}. Every time I click it I get error {error}. We're paying for {plan}, this is not okay."),
        (N, "The {feature} isn't loading on {browser}, just a blank white screen. works in incognito though"),
        (P, "The {feature} seems to be timing out for files larger than about {mb} MB. Is there a limit I should know about?"),
        (N, "The {device} app crashes as soon as I open the {feature}. Reinstalled, same thing."),
        (A, "Your last update wiped all my settings and the {feature} doesn't work anymore. Did anyone test this before pushing it?"),
        (N, "Getting {error} from the API when I call the orders endpoint. Started around {hour}:00 UTC, nothing changed on our side."),
        (P, "Could you check whether the {feature} is down? Our team of {n_users} can't use it and the status page says everything is fine."),
        (N, "sync between the {device} and desktop is not working, changes I make on one never show up on the other"),
        (A, "{app} is so slow today it's unusable. Pages take 30 seconds to load. Fix your servers."),
        (N, "The {feature} exports the dates in the wrong format, {date} shows up as a different day. Timezone bug maybe?"),
        (P, "After the update on {date}, the {feature} shows duplicate entries for every record. Is there a fix coming?"),
        (N, "notifications stopped completely on my {device}. permissions are on, tried logging out and back in"),
        (A, "Lost {lost_hours} hours of work because auto-save silently failed. No warning, nothing. I want an explanation."),
        (N, "The save button in the {feature2} does nothing when clicked on {browser}. Console shows error {error}."),
        (P, "Is the {feature} supposed to work with the {feature2}? When I use both together the page freezes."),
        (N, "Webhook deliveries to our endpoint are failing with {error} since {day}, we see no requests on our side."),
        (A, "Third outage this week. The {feature} is down again. We are seriously considering switching providers."),
        (N, "The {feature} just shows \"{errmsg}\" and a spinner."),
        (N, "bulk upload fails at row {n_users}, no error shown"),
        (P, "We rely on the {feature} for our weekly client reports and since {day} it has been producing empty files. The job completes without errors, the row count in the preview looks right, but the downloaded file is 0 KB. We've tried {browser} and the {device} app with the same result. Could your engineers take a look?"),
        (A, "For the last {n_days} days opening the {feature} has randomly logged our whole team out in the middle of work, and every time someone loses whatever they were typing. We have {n_users} people on the {plan} plan and this is costing us real money. I've opened two tickets already and heard nothing."),
    ],
    "praise": [
        (H, "Just wanted to say the {product} is fantastic. Arrived a day early and works perfectly. Thanks!"),
        (H, "Shoutout to {agent} in support who sorted out my issue in about five minutes. Super friendly and helpful."),
        (H, "Been using {app} for {year} years now and the {feature} is honestly the best thing you've added. Keep it up."),
        (H, "Love my new {color} {garment}!! exactly like the pictures, great quality for {amount}"),
        (H, "The new {feature} saves our {n_users}-person team hours every week. Really well done."),
        (H, "Ordered on {day} and it arrived two days later, packaging was lovely too. Will definitely order again."),
        (H, "I was skeptical about the {gadget} but it's become something I use every single day. {stars} stars."),
        (H, "Your support team is the best I've dealt with. {agent} followed up even after the problem was fixed."),
        (H, "The switch to the {plan} plan was painless and the {feature} works exactly as described. Happy customer here."),
        (H, "bought the {product} as a gift for my dad and he hasn't stopped talking about it lol. thank you"),
        (H, "Just renewed for another year, {app} has made running our small shop in {city} so much easier."),
        (H, "The replacement {product} arrived quickly and works perfectly. Thanks for making it right without any hassle."),
        (H, "Really impressed with the build quality of the {homeware}. Feels way more expensive than {amount}."),
        (H, "Whoever designed the {feature} deserves a raise. Intuitive, fast, and it just works."),
        (H, "This is my third order with you and the {product} is great again. Recommending you to everyone at work."),
        (H, "Thank you for the quick refund on order {order}, I honestly didn't expect it to be that easy."),
        (H, "Dark mode and the new mobile app on my {device} are both great. Nice to see you listening to feedback."),
        (H, "Great service, fast shipping, would buy again."),
        (H, "the {gadget} is amazing, best purchase this year"),
        (H, "I don't usually write to companies, but I wanted to say thank you. My {product} was damaged in transit, and {agent} had a replacement on its way within an hour without asking me to jump through hoops. It arrived {day}, perfect condition. This is why I keep coming back."),
        (H, "We moved our team of {n_users} over to the {plan} plan in {since}, and it's been one of the best tooling decisions we've made. The {feature} in particular replaced two other subscriptions for us, and onboarding new hires takes about half the time. Keep doing what you're doing."),
    ],
    "cancellation": [
        (N, "Please cancel my {plan} subscription effective immediately. I no longer need {app}."),
        (A, "I cancelled on {date} and you still charged me {amount}. Refund it and confirm the account is closed."),
        (P, "I'd like to return the {product} from order {order}. It's unopened. How do I get a return label?"),
        (N, "want to cancel order {order} before it ships, ordered the wrong size. need {size} instead"),
        (A, "Been waiting {n_weeks} weeks for my refund of {amount} for the returned {product}, and {carrier} shows you received it on {date}."),
        (P, "Could you cancel the auto-renewal on my account? I'd like to keep access until the end of the current period."),
        (N, "How do I downgrade from {plan} to {plan2} instead of cancelling completely? Budget got cut."),
        (A, "Your cancel button doesn't work. I've clicked it {n_times}. Cancel my subscription or I'm disputing the charge with my bank."),
        (N, "Returned the {product} on {date}, tracking {tracking}. When will the {amount} show up on my card?"),
        (P, "I'm within the 30 day window, so I'd like a full refund for the {product}. It just isn't right for me."),
        (N, "is it possible to get a partial refund for the unused months? we paid {big_amount} for the year and are shutting down"),
        (A, "You refunded {amount2} instead of {amount}. Where's the rest of my money?"),
        (N, "Cancel order {order} please, found it cheaper elsewhere. Hasn't shipped yet according to the site."),
        (P, "We're moving to a different tool, so please close our {plan} workspace. Could you send an export of our data first?"),
        (A, "Restocking fee of {amount2} on a {product} that arrived broken? No. I want a full refund."),
        (N, "Can I exchange the {color} {garment} for a different colour or do I have to return it and reorder?"),
        (P, "I'd like to cancel my trial before it converts on {date}. Please confirm I won't be charged."),
        (N, "refund status for order {order}? returned it {n_weeks} weeks ago"),
        (N, "Cancel my subscription please, account {email}."),
        (P, "I returned the {product} and the {product2} from order {order} together in one box on {date}. The refund for the first one came through, but the {amount2} for the second is still missing and the order page just says \"{status}\". Could you confirm both items were received and process the remaining refund?"),
        (A, "I asked to cancel on {date}, got an email saying \"we're sorry to see you go\", and then got charged {amount} again on the next billing date anyway. I want that refunded, the account closed for real, and written confirmation that no further charges will happen."),
    ],
}

# Optional extra context sentences, to vary length (used on short/medium messages).
# Each is (regex the template must match, or "" for any; sentence).
SUB = r"subscription|plan|workspace|trial|renewal|months"
PROBLEM = r"log|sign|link|expire|code|locked|password"
EXTRAS = {
    "billing": [("", "I've been a customer since {since} and never had this problem before."),
                (r"charge|billed|statement", "Screenshot of the bank statement attached."),
                ("", "My account email is {email}."),
                ("", "We're on the {plan} plan if that matters.")],
    "shipping": [(r"arrive|delivery|stuck|parcel|shipped|ship\b", "It was a gift so timing matters."),
                 (r"tracking|arrive|stuck|shipped", "The tracking page just says \"{status}\"."),
                 ("", "Order was placed on {date}."),
                 (r"tracking|stuck|delivered|parcel", "{carrier} told me to contact the sender.")],
    "quality": [("", "I've attached photos."),
                ("", "Only used it a handful of times."),
                ("", "Order number is {order}."),
                ("", "I still have the original packaging.")],
    "account": [("", "I'm on a {device} if that helps."),
                (PROBLEM, "Already tried clearing cookies."),
                ("", "My account email is {email}."),
                (PROBLEM, "This started after I changed my password on {day}.")],
    "technical": [("", "Already cleared cache and tried another browser."),
                  ("", "We're on the {plan} plan, {n_users} users."),
                  ("", "Happens on both {browser} and the {device} app."),
                  ("", "Screenshot attached.")],
    "praise": [("", "Will be ordering again soon."),
               ("", "Told all my friends about you."),
               ("", "Customer since {since} and still happy.")],
    "cancellation": [("", "The original payment was {amount}."),
                     (r"refund|return", "I'd prefer the refund to the original card, not store credit."),
                     (SUB, "Nothing wrong with the service, just cutting costs."),
                     ("", "Order number is {order}.")],
}

OPENERS = {
    P: ["Hi,", "Hello,", "Hello there,", "Good morning,", "Hi team,", "Dear support,", "Hi there,",
        "Good afternoon,", "", "", "Hey,", "Dear Sir or Madam,"],
    N: ["", "", "", "", "Hi,", "Hey,", "hi", "Hello,", "Quick question:", "Hey there,", "FYI"],
    A: ["", "", "", "Seriously?", "Hello?", "Unbelievable.", "This is ridiculous.", "Again.",
        "Not happy.", "", "Hi."],
    H: ["", "", "Hi!", "Hey team,", "Hello,", "Just a quick note:", "", "Hey!", "Hi all,"],
}
CLOSERS = {
    P: ["Thanks!", "Thank you.", "Thanks in advance.", "Kind regards, {first}", "Best, {first}",
        "Many thanks, {first_init}", "Appreciate your help.", "", "", "Thank you so much!",
        "Regards, {first_full}"],
    N: ["", "", "", "thanks", "Thanks.", "- {first}", "pls advise", "Cheers", "ty",
        "Let me know.", "thx"],
    A: ["", "", "Reply ASAP.", "I expect a response today.", "Very disappointed.",
        "Not impressed.", "Fix it.", "", "- {first_full}",
        "Going to leave a review about this."],
    H: ["", "", "Cheers!", "Thanks again!", "- {first}", ":)", "Have a great {day}!",
        "Keep up the good work.", "Best, {first_init}", "Much appreciated!"],
}

GREETING_RE = re.compile(r"^(hi|hello|hey|good (morning|afternoon)|dear)\b", re.I)
# First words that must keep their capital letter after "Hi," etc.
PROPER = {"I", "I'm", "I've", "I'd", "I'll", "Google", "Okta", "SSO", "USPS", "UPS", "FedEx",
          "DHL", "OnTrac", "Royal", "Canada", "Dark", "PDF", "VAT"} | set(DAYS) | set(AGENTS)

TYPO_SWAPS = [
    ("receive", "recieve"), ("received", "recieved"), ("definitely", "definately"),
    ("because", "becuase"), ("account", "acount"), ("really", "realy"),
    ("already", "allready"), ("until", "untill"), ("weird", "wierd"),
    ("you", "u"), ("please", "pls"), ("I'm", "im"), ("don't", "dont"),
    ("doesn't", "doesnt"), ("can't", "cant"), ("isn't", "isnt"), ("though", "tho"),
    ("with", "wiht"), ("what", "waht"), ("just", "jsut"),
    ("since", "sicne"), ("their", "there"), ("package", "pakage"), ("working", "workign"),
]


def add_typos(rng: random.Random, text: str) -> str:
    """Apply 1-2 realistic slips (only to words actually present)."""
    candidates = [(a, b) for a, b in TYPO_SWAPS if a in text]
    rng.shuffle(candidates)
    for a, b in candidates[: rng.randint(1, 2)]:
        text = text.replace(a, b, 1)  # one occurrence: reads like a slip, not a style
    return text


def casualise(rng: random.Random, text: str, drop_period: bool) -> str:
    """Lower-case start / drop final period, like a quick phone message."""
    first = text.split(" ", 1)[0]
    if rng.random() < 0.5 and first not in PROPER and first[:1].isupper() and first[1:].islower():
        text = text[0].lower() + text[1:]
    if drop_period and rng.random() < 0.5 and text.endswith("."):
        text = text[:-1]
    return text


def shout(rng: random.Random, text: str) -> str:
    """Angry customers sometimes capitalise a phrase or stack punctuation."""
    r = rng.random()
    if r < 0.3:
        words = text.split(" ")
        i = rng.randrange(len(words))
        j = min(len(words), i + rng.randint(1, 3))
        words[i:j] = [w if "@" in w else w.upper() for w in words[i:j]]
        text = " ".join(words)
    elif r < 0.55:
        text = re.sub(r"[.!]$", "!!!", text) if re.search(r"[.!]$", text) else text + "!!"
    return text


def after_greeting(body: str) -> str:
    """'Hi, Received order ...' -> 'Hi, received order ...' (keep I, names, acronyms)."""
    first = body.split(" ", 1)[0]
    if first in PROPER or not first[:1].isupper() or not first[1:].islower():
        return body
    return body[0].lower() + body[1:]


SLOT_RE = re.compile(r"\{(\w+)\}")


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def compose(rng: random.Random, category: str) -> str:
    tone, template = rng.choice(TEMPLATES[category])
    slots = make_slots(rng)
    body = cap(template.format(**slots))  # "{carrier} left ..." -> "The courier left ..."

    long_template = len(body.split()) >= 40
    if not long_template and rng.random() < 0.3:
        pattern, extra = rng.choice(EXTRAS[category])
        fits = not pattern or re.search(pattern, template, re.I)
        # don't repeat a detail (order number, email...) the body already gives
        fresh = not set(SLOT_RE.findall(extra)) & set(SLOT_RE.findall(template))
        if fits and fresh and not (tone == A and "Nothing wrong" in extra):
            if body[-1] not in ".!?":
                body += "."
            body += " " + cap(extra.format(**slots))

    opener = rng.choice(OPENERS[tone]).format(**slots)
    closer = rng.choice(CLOSERS[tone]).format(**slots)
    if GREETING_RE.match(body):
        opener = ""
    if long_template and rng.random() < 0.5:
        opener = closer = ""  # keep long stories within the word budget

    if tone == A:
        body = shout(rng, body)
    if tone == N and rng.random() < 0.45:
        body = casualise(rng, body, drop_period=not closer)
    if tone in (N, A, H) and rng.random() < 0.2:
        body = add_typos(rng, body)
    if opener.endswith(","):
        body = after_greeting(body)

    text = " ".join(p for p in (opener, body, closer) if p)
    return re.sub(r"\s+", " ", text).strip()


def generate(n_rows: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    categories = list(TEMPLATES)
    plan = [categories[i % len(categories)] for i in range(n_rows)]  # even spread
    rng.shuffle(plan)

    seen: set[str] = set()
    texts: list[str] = []
    for cat in plan:
        for _attempt in range(100):
            text = compose(rng, cat)
            if MIN_WORDS <= len(text.split()) <= MAX_WORDS and text not in seen:
                break
        else:  # pragma: no cover - never hit with the shipped templates
            raise RuntimeError(f"could not make a fresh {cat} message")
        seen.add(text)
        texts.append(text)

    width = max(4, len(str(n_rows)))
    return [{"id": f"msg-{i:0{width}d}", "text": t} for i, t in enumerate(texts, start=1)]


def write(rows: list[dict[str, str]], csv_path: Path, jsonl_path: Path) -> None:
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["id", "text"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with jsonl_path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"id": row["id"], "text": row["text"]}, ensure_ascii=False) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--csv", type=Path, default=CSV_PATH)
    ap.add_argument("--jsonl", type=Path, default=JSONL_PATH)
    args = ap.parse_args()

    rows = generate(args.rows, args.seed)
    write(rows, args.csv, args.jsonl)
    unique = len({r["text"] for r in rows})
    print(f"wrote {len(rows)} rows ({unique} unique texts) to {args.csv} and {args.jsonl}")


if __name__ == "__main__":
    main()
