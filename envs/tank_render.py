"""Numpy rasteriser for TankDuel's ``rgb_array`` render mode (no display, no extra dependency)."""

from __future__ import annotations

import math

import numpy as np

SCALE = 0.5  # 800 x 600 arena -> 400 x 300 image
COLORS = {"bg": (24, 28, 36), "me": (80, 200, 120), "enemy": (220, 90, 80), "bullet": (250, 230, 120),
          "radar": (60, 70, 90), "gun": (240, 240, 240)}


def _disc(img, x, y, r, color):
    h, w, _ = img.shape
    cx, cy = x * SCALE, h - 1 - y * SCALE
    rr = r * SCALE
    y0, y1 = max(int(cy - rr), 0), min(int(cy + rr) + 1, h)
    x0, x1 = max(int(cx - rr), 0), min(int(cx + rr) + 1, w)
    if y0 >= y1 or x0 >= x1:
        return
    yy, xx = np.mgrid[y0:y1, x0:x1]
    m = (xx - cx) ** 2 + (yy - cy) ** 2 <= rr * rr
    img[y0:y1, x0:x1][m] = color


def _line(img, x, y, angle, length, color, steps=24):
    for i in range(steps):
        d = length * i / (steps - 1)
        _disc(img, x + d * math.sin(angle), y + d * math.cos(angle), 1.5, color)


def draw(env) -> np.ndarray:
    from .tank_duel import RADIUS, H, W

    img = np.empty((int(H * SCALE), int(W * SCALE), 3), np.uint8)
    img[:] = COLORS["bg"]
    me, en = env.me, env.enemy
    for k in (-1, 1):  # the radar arc's edges
        _line(img, me.x, me.y, me.radar + k * env.radar_half_arc, 160, COLORS["radar"])
    for tank, c in ((me, COLORS["me"]), (en, COLORS["enemy"])):
        _disc(img, tank.x, tank.y, RADIUS, c)
        _line(img, tank.x, tank.y, tank.gun, RADIUS * 1.8, COLORS["gun"], steps=8)
    for b in env.bullets:
        _disc(img, b.x, b.y, 4, COLORS["bullet"])
    # energy bars along the top: ours (green) left, the enemy's (red) right
    for i, (tank, c) in enumerate(((me, COLORS["me"]), (en, COLORS["enemy"]))):
        n = int(max(0.0, min(tank.energy, 100.0)) / 100 * 150)
        img[4:8, 10 + i * 230: 10 + i * 230 + n] = c
    return img
